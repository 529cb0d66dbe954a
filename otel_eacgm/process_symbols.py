"""Symbol names of code addresses in traced processes, still readable once a process is gone.

A runtime-layer launch names its kernel by the host stub it passes, an address in the traced
process. The agent snapshots a process's executable file mappings as soon as it traces the
process, again after the process opens a library or executes another program (only when its
executable mappings changed), and on a miss while the process lives; the snapshot outlives the
process, so launches read after it exited keep their names. Names come from the mapped files'
own symbol tables (.symtab and .dynsym, probes/elf.py), read once per file on the first lookup
that lands in it and kept while a tracked process maps it.

This replaces libbcc's symbol cache, whose constructor in BCC before 0.33 (Debian 12 ships
0.26) closes an uninitialised file descriptor (iovisor/bcc#5193): in the agent that closed a
live tracepoint fd now and then, silently turning off library discovery.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import logging
import os

import numpy as np

from otel_eacgm.probes.elf import ElfError, ElfFile

log = logging.getLogger(__name__)

_MISSES_LOGGED = 10  # per process: the first misses say where the address fell (DEBUG)


@dataclasses.dataclass(frozen=True)
class _Mapping:
    """One executable file mapping of a process."""

    start: int
    end: int
    offset: int
    path: str
    file_key: tuple[int, int]  # (device, inode) as /proc/PID/maps gives them


class _SymbolTable:
    """The function symbols of one file, sorted by address, with the file kept mapped for names."""

    def __init__(self, path: str) -> None:
        self._elf = ElfFile(path)
        self._values, self._sizes, self._names = self._elf.function_table()

    def name_at(self, file_offset: int) -> str | None:
        """The symbol holding the code at `file_offset` (exactly at its start when it has no size)."""
        try:
            vaddr = self._elf.vaddr(file_offset)
        except ElfError:
            return None
        i = int(np.searchsorted(self._values, vaddr, side="right")) - 1
        while i >= 0 and self._values[i] <= vaddr:
            value, size = int(self._values[i]), int(self._sizes[i])
            if vaddr < value + size or vaddr == value:
                return self._elf.cstr(int(self._names[i]))
            if size == 0 or i == 0 or int(self._values[i - 1]) != value:
                return None
            i -= 1  # several symbols at one address: try the others
        return None

    def close(self) -> None:
        self._elf.close()


class ProcessSymbols:
    """Per-pid snapshots of executable mappings, and the symbol tables of the files they map.

    With `eager`, a process's mappings are read ahead of lookups (`track`, `refresh`); without,
    at its first lookup (the default driver launch layer names kernels from name records and
    never looks a symbol up).
    """

    def __init__(self, *, eager: bool) -> None:
        self.eager = eager
        self._maps: dict[int, list[_Mapping]] = {}
        self._starts: dict[int, list[int]] = {}
        self._code_maps: dict[int, int] = {}  # pid -> hash of its executable mappings when read
        self._tables: dict[tuple[int, int], _SymbolTable | None] = {}  # None: not a readable ELF file
        self._mappers: collections.Counter[tuple[int, int]] = collections.Counter()  # file -> processes mapping it
        self._misses: collections.Counter[int] = collections.Counter()  # pid -> misses logged

    def track(self, pid: int) -> None:
        """Read `pid`'s memory map now (if eager and it was not read yet)."""
        if self.eager:
            self._make(pid)

    def refresh(self, pid: int) -> bool:
        """Read `pid`'s memory map again if its code changed (it opened a library or executed
        another program); whether it did."""
        if not self.eager and pid not in self._maps:
            return False
        if pid not in self._maps:
            self._make(pid)
            return True
        lines = _code_lines(pid)
        if not lines or hash(lines) == self._code_maps[pid]:  # gone: keep the map read while it lived
            return False
        self._read(pid, lines)
        return True

    def resolve(self, pid: int, addr: int) -> str | None:
        """The (undemangled) symbol that holds `addr` in `pid`, or None if none is known."""
        self._make(pid)
        name = self._lookup(pid, addr)
        if name is None and self.refresh(pid):  # the library may be newer than the map last read
            name = self._lookup(pid, addr)
        if name is None and self._misses[pid] < _MISSES_LOGGED and log.isEnabledFor(logging.DEBUG):
            self._misses[pid] += 1
            log.debug("no symbol for 0x%x in pid %d: %s", addr, pid, self._where(pid, addr))
        return name

    def _where(self, pid: int, addr: int) -> str:
        """Where `addr` fell in `pid`'s snapshot, for the log line of a miss."""
        i = bisect.bisect_right(self._starts.get(pid, []), addr) - 1
        if i < 0 or addr >= self._maps[pid][i].end:
            return f"in no executable file mapping of the {len(self._maps.get(pid, ()))} read"
        m = self._maps[pid][i]
        table = self._table(m)
        state = "no readable ELF symbol table" if table is None else "no function symbol covers it"
        return f"{m.path} at file offset 0x{addr - m.start + m.offset:x} ({state})"

    def forget(self, pid: int) -> None:
        """Drop `pid`'s snapshot (it exited), and the symbol tables no other process maps."""
        self._starts.pop(pid, None)
        self._code_maps.pop(pid, None)
        self._misses.pop(pid, None)
        maps = self._maps.pop(pid, None)
        if maps is not None:
            self._remap({m.file_key for m in maps}, set())

    def close(self) -> None:
        """Drop every snapshot and table."""
        for pid in list(self._maps):
            self.forget(pid)

    def _make(self, pid: int) -> None:
        if pid not in self._maps:
            self._read(pid, _code_lines(pid))

    def _read(self, pid: int, lines: tuple[bytes, ...]) -> None:
        self._code_maps[pid] = hash(lines) if lines else 0
        maps = sorted((m for m in map(_parse, lines) if m is not None), key=lambda m: m.start)
        old = {m.file_key for m in self._maps.get(pid, ())}
        self._maps[pid] = maps
        self._starts[pid] = [m.start for m in maps]
        self._remap(old, {m.file_key for m in maps})

    def _lookup(self, pid: int, addr: int) -> str | None:
        i = bisect.bisect_right(self._starts[pid], addr) - 1
        if i < 0:
            return None
        m = self._maps[pid][i]
        if addr >= m.end:
            return None
        table = self._table(m)
        return table.name_at(addr - m.start + m.offset) if table is not None else None

    def _table(self, m: _Mapping) -> _SymbolTable | None:
        if m.file_key not in self._tables:
            try:
                self._tables[m.file_key] = _SymbolTable(m.path)
            except (OSError, ElfError):
                self._tables[m.file_key] = None
        return self._tables[m.file_key]

    def _remap(self, old: set[tuple[int, int]], new: set[tuple[int, int]]) -> None:
        """One process now maps the files `new` instead of `old`: a table no process maps any
        longer is closed (counted per file, so a read costs only that process's mappings)."""
        for key in new - old:
            self._mappers[key] += 1
        for key in old - new:
            self._mappers[key] -= 1
            if self._mappers[key] == 0:
                del self._mappers[key]
                table = self._tables.pop(key, None)
                if table is not None:
                    table.close()

def _code_lines(pid: int) -> tuple[bytes, ...]:
    """`pid`'s executable mappings as /proc/PID/maps lines; empty once the process is gone or a
    zombie (its map is empty)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as fh:
            return tuple(line for line in fh if line.split(maxsplit=2)[1][2:3] == b"x")
    except OSError:
        return ()


def _parse(line: bytes) -> _Mapping | None:
    """A file-backed mapping line of /proc/PID/maps; None for anonymous ones ([vdso], JIT code)."""
    fields = line.split(maxsplit=5)
    if len(fields) < 6 or not fields[5].startswith(b"/"):
        return None
    start, end = (int(x, 16) for x in fields[0].split(b"-"))
    major, minor = (int(x, 16) for x in fields[3].split(b":"))
    path = fields[5].rstrip(b"\n").decode(errors="replace")
    return _Mapping(start, end, int(fields[2], 16), path.removesuffix(" (deleted)"),
                    (os.makedev(major, minor), int(fields[4])))
