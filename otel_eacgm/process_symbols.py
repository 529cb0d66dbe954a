"""Symbol names of code addresses in traced processes, still readable once a process is gone.

BCC reads a process's memory map when its symbol cache for that pid is made, and not again
unless told: an address in a library loaded later stays unknown, and a process that exited
before the first lookup (the agent fell behind its events) has no map left to read. So the
agent makes a process's cache as soon as it traces the process, has it read the map again
after the process opens a library or executes another program, retries a miss once against a
fresh map while the process lives, and frees the cache when the process is gone. The symbol
tables themselves are read from the library files, which outlive the process.

A fresh map drops the symbol tables BCC has read (a large library takes a while to read
again), so the map is read again only when its executable mappings changed. A cache holds one
open file per mapped library (about 70 for a CPU PyTorch process), so caches are made ahead of
lookups only where launches are named by symbol (the runtime launch layer).
"""

from __future__ import annotations

import ctypes

from otel_eacgm.bpf_program import symbol_library


class ProcessSymbols:
    """Per-pid BCC symbol caches, freed explicitly; with `eager`, made and refreshed ahead of
    lookups (`track`, `refresh`), else made at a process's first lookup.

    BCC's Python ``SymbolCache`` never frees its cache, so this class drives the C API
    (``bcc.libbcc``, from bpf_program.symbol_library) directly.
    """

    def __init__(self, *, eager: bool) -> None:
        libbcc = symbol_library()
        self._lib = libbcc.lib
        self._symbol = libbcc.bcc_symbol
        self.eager = eager
        self._caches: dict[int, int] = {}
        self._code_maps: dict[int, int] = {}  # pid -> hash of its executable mappings when read

    def track(self, pid: int) -> None:
        """Read `pid`'s memory map now (if eager and it has no cache yet)."""
        if self.eager:
            self._make(pid)

    def refresh(self, pid: int) -> bool:
        """Read `pid`'s memory map again if its code changed (it opened a library or executed
        another program); whether it did."""
        if not self.eager and pid not in self._caches:
            return False
        if pid not in self._caches:
            self._make(pid)
            return True
        code = _code_map(pid)
        if code is None or code == self._code_maps[pid]:  # gone: keep the map read while it lived
            return False
        self._code_maps[pid] = code
        self._lib.bcc_symcache_refresh(self._caches[pid])
        return True

    def resolve(self, pid: int, addr: int) -> str | None:
        """The (undemangled) symbol that holds `addr` in `pid`, or None if none is known."""
        self._make(pid)
        name = self._lookup(pid, addr)
        if name is None and self.refresh(pid):  # the library may be newer than the map last read
            name = self._lookup(pid, addr)
        return name

    def forget(self, pid: int) -> None:
        """Free `pid`'s cache (it exited)."""
        cache = self._caches.pop(pid, None)
        self._code_maps.pop(pid, None)
        if cache is not None:
            self._lib.bcc_free_symcache(cache, pid)

    def close(self) -> None:
        """Free every cache."""
        for pid in list(self._caches):
            self.forget(pid)

    def _make(self, pid: int) -> None:
        if pid not in self._caches:
            self._code_maps[pid] = _code_map(pid) or 0
            self._caches[pid] = self._lib.bcc_symcache_new(pid, None)

    def _lookup(self, pid: int, addr: int) -> str | None:
        sym = self._symbol()
        if self._lib.bcc_symcache_resolve_no_demangle(self._caches[pid], addr, ctypes.byref(sym)) < 0 or not sym.name:
            return None
        return sym.name.decode(errors="replace")


def _code_map(pid: int) -> int | None:
    """Hash of `pid`'s executable mappings (address, offset, file); None once the process is
    gone or a zombie (its map is empty)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as fh:
            code = tuple(line for line in fh if line.split(maxsplit=2)[1][2:3] == b"x")
    except OSError:
        return None
    return hash(code) if code else None
