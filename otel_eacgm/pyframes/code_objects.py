"""Code objects -> names, read from the traced process' memory (/proc/PID/mem), cached.

The BPF walk records a frame's code object address, its instruction offset and the
co_firstlineno it saw there. A code object can be freed and its address reused by another by
the time the record is read, so a cached or fresh answer is used only when the object at that
address is a code object (ob_type is PyCode_Type) whose co_firstlineno is the one the walk saw;
otherwise the frame is unnamed (None), never named after the wrong function.
Cached per process (dropped on exec and exit); line numbers come from the code's line table.
"""

from __future__ import annotations

import dataclasses
import os
import struct

from otel_eacgm.pyframes.layouts import CodeLayout

_MAX_TEXT = 4096         # characters of a name or path read
_MAX_LINETABLE = 1 << 20
_CACHE_PER_PROCESS = 65536
_MAX_REFCNT = 1 << 40      # above: not a count (a pointer); immortal objects (3.12+) stay below


@dataclasses.dataclass(frozen=True)
class CodeInfo:
    """What a code object says of itself."""

    name: str               # co_name
    qualname: str           # co_qualname (3.11+), co_name before (the caller may refine it)
    file: str               # co_filename
    firstlineno: int
    linetable: bytes

    def line_of(self, instr: int, minor: int) -> int:
        """The source line of the instruction at byte offset `instr` (co_firstlineno if unknown)."""
        line = line_310(self.linetable, self.firstlineno, instr) if minor < 11 else \
            line_311(self.linetable, self.firstlineno, instr)
        return line if line is not None and line > 0 else self.firstlineno


def line_310(table: bytes, firstlineno: int, offset: int) -> int | None:
    """3.10's co_linetable: (bytecode bytes, signed line delta) pairs; -128: no line."""
    line, addr = firstlineno, 0
    for i in range(0, len(table) - 1, 2):
        sdelta, ldelta = table[i], table[i + 1]
        ldelta = ldelta - 256 if ldelta >= 128 else ldelta
        if ldelta != -128:
            line += ldelta
        end = addr + sdelta
        if addr <= offset < end:
            return None if ldelta == -128 else line
        addr = end
    return None


def _varint(table: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while i < len(table):
        b = table[i]
        i += 1
        value |= (b & 63) << shift
        shift += 6
        if not b & 64:
            break
    return value, i


def line_311(table: bytes, firstlineno: int, offset: int) -> int | None:
    """3.11+'s location table: entries of (code, length in code units), line deltas by code."""
    line, addr, i = firstlineno, 0, 0
    target = offset // 2
    while i < len(table):
        first = table[i]
        i += 1
        code, length = (first >> 3) & 15, (first & 7) + 1
        delta: int | None
        if code == 15:
            delta = None
        elif code == 14:  # long form: line delta, end line delta, column, end column
            raw, i = _varint(table, i)
            delta = -(raw >> 1) if raw & 1 else raw >> 1
            for _ in range(3):
                _, i = _varint(table, i)
        elif code == 13:  # no column
            raw, i = _varint(table, i)
            delta = -(raw >> 1) if raw & 1 else raw >> 1
        elif code >= 10:  # one-line form: line delta code - 10, then column and end column
            delta = code - 10
            i += 2
        else:  # short form: same line, one column byte
            delta = 0
            i += 1
        if delta is not None:
            line += delta
        if addr <= target < addr + length:
            return None if delta is None else line
        addr += length
    return None


def _alive(head: bytes, size: int, c: CodeLayout, code_type: int) -> bool:
    """Whether `head` looks like a live code object: its type, and a reference count (freed
    memory holds the allocator's free-list pointer there, or zero)."""
    if len(head) < size:
        return False
    refcnt = int.from_bytes(head[0:8], "little")
    return 0 < refcnt < _MAX_REFCNT and int.from_bytes(head[c.ob_type:c.ob_type + 8], "little") == code_type


def _fields(head: bytes, offsets: list[int]) -> list[bytes]:
    return [head[off:off + 8] for off in offsets]


class ProcessMemory:
    """Reads of one process' memory; empty bytes where it cannot be read. Opened per use: a
    descriptor kept across an exec would read the old program's memory (or nothing)."""

    def __init__(self, pid: int, proc: str = "/proc") -> None:
        self._fd = os.open(f"{proc}/{pid}/mem", os.O_RDONLY)

    def __enter__(self) -> ProcessMemory:
        return self

    def __exit__(self, *_exc: object) -> None:
        os.close(self._fd)

    def read(self, addr: int, size: int) -> bytes:
        try:
            return os.pread(self._fd, size, addr)
        except (OSError, OverflowError, ValueError):
            return b""


class CodeReader:
    """Names of code objects of the processes running one known interpreter layout each."""

    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc
        self._procs: dict[int, tuple[CodeLayout, int]] = {}
        self._cache: dict[int, dict[tuple[int, int], CodeInfo]] = {}

    def track(self, pid: int, code: CodeLayout, code_type: int) -> bool:
        """Read `pid`'s code objects with `code` (PyCode_Type at `code_type` in the process)."""
        self.forget(pid)
        if not os.path.exists(f"{self._proc}/{pid}/mem"):
            return False
        self._procs[pid] = (code, code_type)
        self._cache[pid] = {}
        return True

    def forget(self, pid: int) -> None:
        """The process exited or executed another program: its addresses mean nothing now."""
        self._procs.pop(pid, None)
        self._cache.pop(pid, None)

    def info(self, pid: int, code_addr: int, firstlineno: int) -> CodeInfo | None:
        """The code object at `code_addr` if it is still the one the walk saw, else None."""
        cache = self._cache.get(pid)
        if cache is None or not code_addr:
            return None
        key = (code_addr, firstlineno)
        hit = cache.get(key)
        if hit is not None:
            return hit
        info = self._read(pid, code_addr)
        if info is None or info.firstlineno != firstlineno:
            return None
        if len(cache) >= _CACHE_PER_PROCESS:
            cache.clear()
        cache[key] = info
        return info

    def _read(self, pid: int, addr: int) -> CodeInfo | None:
        try:
            with ProcessMemory(pid, self._proc) as mem:
                return self._read_from(mem, addr, *self._procs[pid])
        except OSError:  # the process is gone
            return None

    def _read_from(self, mem: ProcessMemory, addr: int, c: CodeLayout, code_type: int) -> CodeInfo | None:
        fields = [c.ob_type, c.co_filename, c.co_name, c.co_linetable, c.co_firstlineno]
        if c.co_qualname is not None:
            fields.append(c.co_qualname)
        size = max(fields) + 8
        head = mem.read(addr, size)
        if not _alive(head, size, c, code_type):
            return None

        def ptr(off: int) -> int:
            return int.from_bytes(head[off:off + 8], "little")

        name = self._text(mem, c, ptr(c.co_name))
        file = self._text(mem, c, ptr(c.co_filename))
        qualname = self._text(mem, c, ptr(c.co_qualname)) if c.co_qualname is not None else name
        linetable = self._bytes(mem, c, ptr(c.co_linetable))
        # A freed code object keeps its type and fields for a while, but not its strings (they
        # are freed with it and reused): what was read counts only if the object is still the
        # same live one afterwards.
        again = mem.read(addr, size)
        if name is None or file is None or qualname is None or not _alive(again, size, c, code_type) or \
                _fields(again, fields) != _fields(head, fields):
            return None
        firstlineno = struct.unpack_from("<i", head, c.co_firstlineno)[0]
        return CodeInfo(name, qualname, file, firstlineno, linetable)

    @staticmethod
    def _text(mem: ProcessMemory, c: CodeLayout, addr: int) -> str | None:
        """A compact str object's text (the kinds code objects hold); None if it is not one."""
        head = mem.read(addr, c.compact_size)
        if len(head) < c.compact_size:
            return None
        length = struct.unpack_from("<q", head, c.unicode_length)[0]
        state = struct.unpack_from("<I", head, c.unicode_state)[0]
        kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
        if not compact or kind not in (1, 2, 4) or not 0 <= length <= _MAX_TEXT:
            return None
        start = addr + (c.ascii_size if ascii_ else c.compact_size)
        data = mem.read(start, length * kind)
        if len(data) < length * kind:
            return None
        codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
        return data.decode(codec, errors="replace")

    @staticmethod
    def _bytes(mem: ProcessMemory, c: CodeLayout, addr: int) -> bytes:
        size = int.from_bytes(mem.read(addr + c.bytes_size, 8), "little")
        if not 0 < size <= _MAX_LINETABLE:
            return b""
        return mem.read(addr + c.bytes_data, size)
