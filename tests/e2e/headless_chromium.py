"""Debian's Chromium, headless, from its command line: no driver protocol is needed to let a
page's scripts run (--virtual-time-budget) and then read its DOM or take a screenshot."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

#: Virtual milliseconds the page may run (fetches and rendering) before it is read.
BUDGET_MS = 20000


def _chromium(*args: str, timeout_s: float = 90) -> subprocess.CompletedProcess:
    binary = shutil.which("chromium")
    if binary is None:
        raise AssertionError("chromium is not installed: scripts/setup.sh installs it (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="eacgm-chromium-") as profile:
        # --no-sandbox: Chromium refuses to run as root with its sandbox.
        cmd = [binary, "--headless", "--disable-gpu", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
               "--hide-scrollbars", f"--virtual-time-budget={BUDGET_MS}",
               *(["--no-sandbox"] if os.geteuid() == 0 else []), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise AssertionError(f"chromium {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def dump_dom(url: str) -> str:
    """The page's DOM, serialized, once its scripts have run."""
    return _chromium("--dump-dom", url).stdout


def screenshot(url: str, path: Path, width: int, height: int) -> None:
    """A PNG of the rendered page at width x height."""
    _chromium(f"--screenshot={path}", f"--window-size={width},{height}", url)


def checked_screenshot(url: str, path: Path, size: tuple[int, int], docs_copy: Path | None = None) -> None:
    """Screenshot `url` to `path`, fail if it is not `size` or (nearly) blank, and copy it to
    `docs_copy` when EACGM_DOCS_SCREENSHOTS=1 (how docs/screenshots/ is refreshed)."""
    screenshot(url, path, *size)
    width, height, colours = png_size_and_colours(path)
    assert (width, height) == size
    assert path.stat().st_size > 20_000 and colours > 64, "the screenshot is (nearly) blank"
    if docs_copy is not None and os.environ.get("EACGM_DOCS_SCREENSHOTS") == "1":
        docs_copy.parent.mkdir(exist_ok=True)
        docs_copy.write_bytes(path.read_bytes())


def png_size_and_colours(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct byte values of the decoded rows) of a PNG file."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    idat, pos = b"", 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return width, height, len(set(zlib.decompress(idat)))
