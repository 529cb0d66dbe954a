"""Interpreter layouts read from the real interpreter files here: our table for 3.10-3.12, the
interpreter's own _Py_DebugOffsets for 3.13 (the path 3.14 takes), and refusals: a version the
agent does not know, and a debug-offsets table that fails the sense checks (a copy of the real
3.13 library with one offset broken)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from otel_eacgm.events import PY_NONE
from otel_eacgm.probes.elf import ElfFile
from otel_eacgm.pyframes.layouts import UnknownInterpreter, interpreter

PYENV = Path("/root/.pyenv/versions")
LIB313 = PYENV / "3.13.0/lib/libpython3.13.so.1.0"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is not installed")
    return path


@pytest.mark.parametrize(("path", "minor", "source"), [
    (PYENV / "3.10.13/lib/libpython3.10.so.1.0", 10, "table"),
    (PYENV / "3.11.7/lib/libpython3.11.so.1.0", 11, "table"),
    (Path("/usr/bin/python3.11"), 11, "table"),
    (PYENV / "3.12.1/lib/libpython3.12.so.1.0", 12, "table"),
    (LIB313, 13, "debug offsets"),
])
def test_known_interpreters(path: Path, minor: int, source: str) -> None:
    interp = interpreter(str(need(path)))
    assert interp is not None and (interp.minor, interp.source) == (minor, source)
    layout = interp.layout
    assert layout.match_fs == (minor == 10) and layout.lasti == (minor == 10)
    assert (layout.fr_owner == PY_NONE) == (minor == 10)
    assert (layout.cframe_frame != PY_NONE) == (minor in (11, 12))
    assert interp.code.co_qualname is None if minor == 10 else interp.code.co_qualname == 128


def test_debug_offsets_give_what_the_headers_say() -> None:
    """3.13.0's values, from offsetof() against its own internal headers."""
    interp = interpreter(str(need(LIB313)))
    assert interp is not None
    l, c = interp.layout, interp.code
    assert (l.interp_head, l.threads_head, l.ts_next, l.ts_id, l.ts_frame) == (632, 7344, 8, 160, 72)
    assert (l.fr_back, l.fr_code, l.fr_instr, l.fr_owner, l.co_firstlineno, l.co_code) == (8, 0, 56, 70, 68, 200)
    assert (c.co_filename, c.co_name, c.co_qualname, c.co_linetable) == (112, 120, 128, 136)
    assert (c.ascii_size, c.unicode_state, c.unicode_length, c.bytes_data) == (40, 32, 16, 32)


def test_an_executable_linked_to_libpython_holds_no_interpreter() -> None:
    assert interpreter(str(need(PYENV / "3.12.1/bin/python3.12"))) is None


def test_unknown_version_is_refused() -> None:
    with pytest.raises(UnknownInterpreter, match="CPython 3.9 has no _Py_DebugOffsets"):
        interpreter(str(need(PYENV / "3.9.18/lib/libpython3.9.so.1.0")))


def _patched(tmp_path: Path, word: int, value: int) -> str:
    """A copy of the 3.13 library with u64 number `word` of its _Py_DebugOffsets set to `value`."""
    copy = tmp_path / LIB313.name
    shutil.copyfile(need(LIB313), copy)
    with ElfFile(str(copy)) as elf:
        offset = elf.file_offset(elf.symbol("_PyRuntime"))
    with open(copy, "r+b") as fh:
        fh.seek(offset + 8 * word)
        fh.write(value.to_bytes(8, "little"))
    return str(copy)


def test_debug_offsets_failing_the_sense_checks_are_refused(tmp_path: Path) -> None:
    # thread_state.next (word 21) pointing past the end of PyThreadState
    with pytest.raises(UnknownInterpreter, match="fail the sense checks"):
        interpreter(_patched(tmp_path, 21, 1 << 20))


def test_debug_offsets_of_an_unknown_minor_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UnknownInterpreter, match="3.15's _Py_DebugOffsets is not known"):
        interpreter(_patched(tmp_path, 1, 0x030F00F0))


def test_free_threaded_builds_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UnknownInterpreter, match="free-threaded"):
        interpreter(_patched(tmp_path, 2, 1))
