"""Where a CPython interpreter keeps its thread states, frames and code objects.

3.10-3.12 come from a table of ours, made by compiling offsetof() against each version's own
internal headers (pyenv's 3.10.13, 3.11.7, 3.12.1 and Debian's 3.11.2 agree where they
overlap). 3.13 and later carry the table themselves: ``_PyRuntime`` starts with
``_Py_DebugOffsets`` (cookie ``xdebugpy``), written by the interpreter's own compiler, so a
patch release that moves a field keeps working. Only where the offsets sit inside that table
is ours, per minor version, and what it gives is checked for sense before use; a table that
fails the checks, a minor version not listed, or a free-threaded build is refused
(UnknownInterpreter), and the agent reports it rather than read the process wrongly.

The table is read from the file, not the process: ``_PyRuntime`` is initialised data.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import re
import struct

from otel_eacgm.events import PY_FRAMES, PY_NONE, PyLayout
from otel_eacgm.probes.elf import ElfError, ElfFile
from otel_eacgm.pyframes.kernel_btf import BtfError, task_fsbase_offset

FRAME_READ_MAX = 128  # bytes of a frame the BPF walk reads at once (struct py_frame_buf)
DEBUG_COOKIE = b"xdebugpy"
TESTED = ("3.10", "3.11", "3.12", "3.13")  # versions tests run under real uprobes
_VERSION_IN_NAME = re.compile(r"python(3)\.(\d+)")


class UnknownInterpreter(ValueError):
    """An interpreter whose frames the agent cannot read (its other layers are still traced)."""


@dataclasses.dataclass(frozen=True)
class CodeLayout:
    """Offsets user space needs to name a code object (otel_eacgm/pyframes/code_objects.py)."""

    ob_type: int = 8
    co_filename: int = 0
    co_name: int = 0
    co_qualname: int | None = None  # None before 3.11: the source file gives the qualified name
    co_linetable: int = 0
    co_firstlineno: int = 0
    unicode_state: int = 32
    unicode_length: int = 16
    ascii_size: int = 40        # sizeof(PyASCIIObject): compact ASCII text follows it
    compact_size: int = 56      # sizeof(PyCompactUnicodeObject): other compact text follows it
    bytes_size: int = 16        # PyBytesObject: ob_size
    bytes_data: int = 32        # PyBytesObject: ob_sval


@dataclasses.dataclass(frozen=True)
class Interpreter:
    """One interpreter file's layout (addresses relative to the file's own link addresses)."""

    path: str
    minor: int
    runtime: int          # _PyRuntime's link address
    code_type: int        # PyCode_Type's link address (a frame's code is checked against it)
    layout: PyLayout      # runtime is the link address: add the load bias per process
    code: CodeLayout
    source: str           # "table" or "debug offsets"

    @property
    def version(self) -> str:
        return f"3.{self.minor}"

    def for_process(self, bias: int, max_frames: int) -> PyLayout:
        """The layout for a process that loaded this file `bias` bytes from its link address."""
        out = PyLayout()
        ctypes.memmove(ctypes.addressof(out), ctypes.addressof(self.layout), ctypes.sizeof(PyLayout))
        out.runtime = self.runtime + bias
        out.max_frames = max(1, min(max_frames, PY_FRAMES))
        if out.match_fs:
            out.task_fsbase = task_fsbase_offset()
        return out


def _layout(**fields: int) -> PyLayout:
    layout = PyLayout(cframe_frame=PY_NONE, fr_owner=PY_NONE)
    for name, value in fields.items():
        setattr(layout, name, value)
    return layout


# Our table for the versions without _Py_DebugOffsets (offsetof() against their headers).
_TABLE: dict[int, tuple[PyLayout, CodeLayout]] = {
    10: (_layout(interp_head=32, threads_head=8, ts_next=8, ts_id=176, ts_frame=24, fr_back=24, fr_code=32,
                 fr_instr=96, fr_size=104, co_firstlineno=40, co_code=0, match_fs=1, lasti=1),
         CodeLayout(co_filename=104, co_name=112, co_linetable=120, co_firstlineno=40, ascii_size=48,
                    compact_size=72)),
    11: (_layout(interp_head=40, threads_head=16, ts_next=8, ts_id=160, ts_frame=56, cframe_frame=8, fr_back=48,
                 fr_code=32, fr_instr=56, fr_owner=69, fr_size=80, co_firstlineno=72, co_code=184),
         CodeLayout(co_filename=112, co_name=120, co_qualname=128, co_linetable=136, co_firstlineno=72,
                    ascii_size=48, compact_size=72)),
    12: (_layout(interp_head=40, threads_head=72, ts_next=8, ts_id=144, ts_frame=56, cframe_frame=0, fr_back=8,
                 fr_code=0, fr_instr=56, fr_owner=70, fr_size=80, co_firstlineno=68, co_code=192),
         CodeLayout(co_filename=112, co_name=120, co_qualname=128, co_linetable=136, co_firstlineno=68)),
}

# Where the fields we use sit inside _Py_DebugOffsets, per minor version (u64 indexes).
# 3.13: Include/internal/pycore_runtime.h (checked by compiling offsetof against 3.13.0).
# 3.14: Include/internal/pycore_debug_offsets.h (adds free_threaded after version,
# interpreter_state.threads_main; not installable here, so untested).
_DEBUG_FIELDS: dict[int, dict[str, int]] = {
    13: {"interp_head": 5, "threads_head": 9, "ts_size": 19, "ts_next": 21, "ts_frame": 23, "ts_native": 25,
         "fr_size": 28, "fr_previous": 29, "fr_executable": 30, "fr_instr": 31, "fr_owner": 33, "co_size": 34,
         "co_filename": 35, "co_name": 36, "co_qualname": 37, "co_linetable": 38, "co_firstlineno": 39,
         "co_code": 43, "ob_type": 45, "bytes_size": 65, "bytes_data": 66, "u_state": 68, "u_length": 69,
         "u_ascii": 70},
    14: {"interp_head": 5, "threads_head": 9, "ts_size": 20, "ts_next": 22, "ts_frame": 24, "ts_native": 26,
         "fr_size": 29, "fr_previous": 30, "fr_executable": 31, "fr_instr": 32, "fr_owner": 34, "co_size": 36,
         "co_filename": 37, "co_name": 38, "co_qualname": 39, "co_linetable": 40, "co_firstlineno": 41,
         "co_code": 45, "ob_type": 47, "bytes_size": 71, "bytes_data": 72, "u_state": 74, "u_length": 75,
         "u_ascii": 76},
}


def _minor_of(elf: ElfFile, path: str) -> int:
    """The minor version: Py_Version (3.11+, the interpreter's own PY_VERSION_HEX), else the name."""
    addr = elf.symbol("Py_Version")
    if addr is not None:
        hexversion = int.from_bytes(elf.read(addr, 4), "little")
        if hexversion >> 24 != 3:
            raise UnknownInterpreter(f"{path}: Py_Version {hexversion:#x} is not CPython 3")
        return (hexversion >> 16) & 0xFF
    m = _VERSION_IN_NAME.search(path.rsplit("/", 1)[-1])
    if m is None:
        raise UnknownInterpreter(f"{path}: neither Py_Version nor a version in the file name")
    return int(m.group(2))


def _from_debug_offsets(blob: bytes, minor: int, path: str) -> tuple[PyLayout, CodeLayout]:
    fields = _DEBUG_FIELDS.get(minor)
    if fields is None:
        raise UnknownInterpreter(f"{path}: CPython 3.{minor}'s _Py_DebugOffsets is not known to this agent "
                                 f"(known: {', '.join(f'3.{m}' for m in sorted(_DEBUG_FIELDS))})")
    words = struct.unpack_from(f"<{len(blob) // 8}Q", blob)
    if words[2]:
        raise UnknownInterpreter(f"{path}: a free-threaded build (its frames are not walked)")

    def get(name: str) -> int:
        return words[fields[name]]

    def fits(names: tuple[str, ...], size: str, width: int = 8) -> bool:
        return all(get(n) + width <= get(size) for n in names)

    # Sense checks: a wrong idea of where the fields sit shows as offsets outside their struct.
    ok = (fits(("ts_next", "ts_frame", "ts_native"), "ts_size")
          and fits(("fr_previous", "fr_executable", "fr_instr"), "fr_size") and fits(("fr_owner",), "fr_size", 1)
          and fits(("co_filename", "co_name", "co_qualname", "co_linetable"), "co_size")
          and fits(("co_firstlineno",), "co_size", 4) and get("co_code") < get("co_size") + 8
          and get("fr_size") <= 256 and get("interp_head") < 1 << 16 and get("threads_head") < 1 << 16)
    frame_read = max(get("fr_previous"), get("fr_executable"), get("fr_instr")) + 8
    frame_read = max(frame_read, get("fr_owner") + 1)
    if not ok or frame_read > FRAME_READ_MAX:
        raise UnknownInterpreter(f"{path}: its _Py_DebugOffsets fail the sense checks for CPython 3.{minor}")
    layout = _layout(interp_head=get("interp_head"), threads_head=get("threads_head"), ts_next=get("ts_next"),
                     ts_id=get("ts_native"), ts_frame=get("ts_frame"), fr_back=get("fr_previous"),
                     fr_code=get("fr_executable"), fr_instr=get("fr_instr"), fr_owner=get("fr_owner"),
                     fr_size=frame_read, co_firstlineno=get("co_firstlineno"), co_code=get("co_code"),
                     tagged=int(minor >= 14))
    code = CodeLayout(ob_type=get("ob_type"), co_filename=get("co_filename"), co_name=get("co_name"),
                      co_qualname=get("co_qualname"), co_linetable=get("co_linetable"),
                      co_firstlineno=get("co_firstlineno"), unicode_state=get("u_state"),
                      unicode_length=get("u_length"), ascii_size=get("u_ascii"),
                      compact_size=get("u_ascii") + 16, bytes_size=get("bytes_size"), bytes_data=get("bytes_data"))
    return layout, code


def interpreter(path: str) -> Interpreter | None:
    """The layout of the interpreter in `path` (an executable or libpython); None if the file
    holds no interpreter (a python executable linked against libpython). Raises
    UnknownInterpreter for one the agent cannot read."""
    try:
        with ElfFile(path) as elf:
            runtime = elf.symbol("_PyRuntime")
            if runtime is None:
                return None
            minor = _minor_of(elf, path)
            code_type = elf.symbol("PyCode_Type") or 0
            head = elf.read(runtime, 1024)
    except (OSError, ElfError) as exc:
        raise UnknownInterpreter(f"{path}: cannot read it ({exc})") from None
    if head[:8] == DEBUG_COOKIE:
        hexversion = int.from_bytes(head[8:16], "little")
        layout, code = _from_debug_offsets(head, (hexversion >> 16) & 0xFF, path)
        source = "debug offsets"
    elif minor in _TABLE:
        layout, code = _TABLE[minor]
        source = "table"
    else:
        raise UnknownInterpreter(f"{path}: CPython 3.{minor} has no _Py_DebugOffsets and is not in the agent's "
                                 f"table (3.10-3.12)")
    if not code_type:
        raise UnknownInterpreter(f"{path}: no PyCode_Type symbol to check code objects against")
    if layout.match_fs:
        try:
            task_fsbase_offset()
        except BtfError as exc:
            raise UnknownInterpreter(f"{path}: CPython 3.{minor} knows threads by their fs base, which this "
                                     f"kernel's BTF does not locate ({exc})") from None
    return Interpreter(path, minor, runtime, code_type, layout, code, source)


def load_bias(pid: int, path: str, proc: str = "/proc") -> int | None:
    """How far `pid` loaded the file at `path` from its link addresses (0 for a fixed-address
    executable); None if the process does not map it."""
    try:
        st = os.stat(path)
        with ElfFile(path) as elf:
            first = min((seg[3] - seg[2] for seg in elf.segments if seg[0] == 1), default=0)
        with open(f"{proc}/{pid}/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) < 6 or int(parts[4]) != st.st_ino:
                    continue
                start, offset = int(parts[0].split("-")[0], 16), int(parts[2], 16)
                return start - offset - first
    except (OSError, ElfError, ValueError):
        return None
    return None


def frame_support(path: str) -> str | None:
    """What the frame walk makes of the interpreter file `path` (doctor): None if the file holds
    no interpreter; raises UnknownInterpreter with the reason if it cannot read it."""
    interp = interpreter(path)
    if interp is None:
        return None
    tested = "" if interp.version in TESTED else ", untested"
    return f"CPython {interp.version} frames read (layout from {interp.source}{tested})"
