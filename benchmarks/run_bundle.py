"""One archive of a benchmark's output folder, in parts small enough to come back from a device.

A device command returns at most 8 files of at most 16 MiB each from ``$OUT``, and a recorded
benchmark is a folder of hundreds of megabytes of OTLP/JSON (which compresses about 18 to 1).
:func:`write_bundle` streams the folder into one ``.tar.gz``; past ``part_bytes`` the stream is
cut into ``FILE.000``, ``FILE.001``, ... (``cat FILE.* | tar xz`` joins them), so no part is
over the limit and nothing has to be staged twice on the device's disk.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

#: What a device command brings back: files, and bytes per file.
MAX_FILES = 8
MAX_FILE_BYTES = 16 << 20


class _Parts(io.RawIOBase):
    """A write-only stream that fills ``dest.000``, ``dest.001``, ... up to ``part_bytes`` each."""

    def __init__(self, dest: Path, part_bytes: int) -> None:
        super().__init__()
        self.dest = dest
        self.part_bytes = part_bytes
        self.paths: list[Path] = []
        self._fh: io.BufferedWriter | None = None
        self._left = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        while view:
            if self._left == 0:
                self._next()
            n = min(self._left, len(view))
            assert self._fh is not None
            self._fh.write(view[:n])
            self._left -= n
            view = view[n:]
        return len(data)

    def _next(self) -> None:
        if self._fh is not None:
            self._fh.close()
        path = self.dest.with_name(f"{self.dest.name}.{len(self.paths):03d}")
        self.paths.append(path)
        self._fh = open(path, "wb")  # noqa: SIM115 - closed by _next or close
        self._left = self.part_bytes

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        super().close()


def write_bundle(src: Path, dest: Path, part_bytes: int = MAX_FILE_BYTES - (1 << 20)) -> list[Path]:
    """Pack the folder ``src`` (as top-level folder ``src.name``) into ``dest``, a .tar.gz.

    Returns the files written: ``[dest]`` when the archive fits in ``part_bytes``, else its
    parts ``dest.000``, ``dest.001``, ... Earlier bundles at ``dest`` are removed first, so
    stale parts never join a new archive.
    """
    src, dest = src.resolve(), dest.resolve()
    if dest.is_relative_to(src):
        raise ValueError(f"--bundle {dest} is inside the folder it packs ({src}); put it elsewhere, e.g. in $OUT")
    if part_bytes <= 0:
        raise ValueError(f"bundle part size {part_bytes} bytes, expected > 0")
    dest.parent.mkdir(parents=True, exist_ok=True)
    for old in [dest, *dest.parent.glob(f"{dest.name}.[0-9][0-9][0-9]")]:
        old.unlink(missing_ok=True)
    parts = _Parts(dest, part_bytes)
    with parts, tarfile.open(fileobj=parts, mode="w|gz") as tar:
        tar.add(src, arcname=src.name)
    if len(parts.paths) == 1:
        parts.paths[0].rename(dest)
        return [dest]
    return parts.paths
