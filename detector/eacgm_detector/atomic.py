"""Writing an output file so that it is either the old file or the whole new one.

``fit`` and ``score`` overwrite their ``--output``. Opened in place, a failure halfway (the disk
full, the process killed) would leave a truncated file and destroy the model or scores that
were there. :func:`atomic_write` writes a temporary file beside the target, flushes and
fsyncs it, and renames it over the target (``os.replace``, atomic within a file system); the
directory is fsynced so the rename itself survives a crash. On any failure the temporary file
is removed and the target is untouched.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_write"]


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "wb", **open_kwargs) -> Iterator[IO]:
    """Open a temporary file beside ``path`` for writing; on a clean exit it replaces ``path``.

    A target that exists and is no regular file (``/dev/stdout``, a FIFO) is written directly:
    there is nothing to replace atomically. A symlink is followed, so the file it points to is
    replaced and the link stays. A replaced file keeps its permission bits; a new one gets the
    usual ``0o666`` less the umask. An ``OSError`` names ``path`` and says it is unchanged.
    """
    target = Path(os.path.realpath(path))
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(target, mode, **open_kwargs) as fh:
            yield fh
        return
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write {path}: {exc.strerror or exc} ({tmp})") from exc
    try:
        with os.fdopen(fd, mode, **open_kwargs) as fh:  # closes fd from here on
            if st is not None:
                os.fchmod(fh.fileno(), stat.S_IMODE(st.st_mode))
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            kept = "left unchanged" if st is not None else "not created"
            raise OSError(exc.errno, f"cannot write {path}: {exc.strerror or exc}; {path} {kept}") from exc
        raise
    _fsync_dir(target.parent)


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable; file systems that cannot fsync a directory
    (some network and FUSE ones) are left to their own guarantees."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
