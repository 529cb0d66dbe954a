"""Kernel names for launches, per traced process.

Runtime launches pass the host stub's address, whose ELF symbol names the kernel, or (nvcc 12.8
and later) a handle that `__cudaGetKernel` returned for that stub, named by that record. Driver launches
pass a CUfunction (or a CUkernel cast to one): the driver's name records
(cuModuleGetFunction / cuLibraryGetKernel / cuKernelGetFunction), seen earlier by the agent,
name it. Both are cached and forgotten when the process exits.
"""

from __future__ import annotations

from collections.abc import Callable

from otel_eacgm.demangle import demangle

UNKNOWN = "[unknown]"
_MAX_PER_PROCESS = 65536


class KernelNames:
    """Handle/address -> demangled kernel name, per pid.

    ``symbolize(pid, addr)`` resolves an address in a live process to a symbol name (BCC's
    symbolizer in the agent); it is injected so that this class is testable without BPF.
    """

    def __init__(self, symbolize: Callable[[int, int], str | None]) -> None:
        self._symbolize = symbolize
        self._by_pid: dict[int, dict[int, str]] = {}

    def record(self, pid: int, handle: int, name: str) -> None:
        """Remember a driver handle's name (from a name-record call)."""
        table = self._by_pid.setdefault(pid, {})
        if len(table) < _MAX_PER_PROCESS:
            table[handle] = demangle(name)

    def alias(self, pid: int, new_handle: int, known_handle: int) -> None:
        """cuKernelGetFunction: a CUfunction for an already named CUkernel."""
        name = self._by_pid.get(pid, {}).get(known_handle)
        if name is not None:
            self.record(pid, new_handle, name)

    def alias_address(self, pid: int, handle: int, stub: int) -> None:
        """__cudaGetKernel: a runtime kernel handle takes the name of the host stub it was made for."""
        name = self.for_address(pid, stub)
        table = self._by_pid.setdefault(pid, {})
        if name != UNKNOWN and len(table) < _MAX_PER_PROCESS:
            table[handle] = name

    def for_handle(self, pid: int, handle: int) -> str:
        """Name of a driver function/kernel handle, or "[unknown]" if never recorded."""
        return self._by_pid.get(pid, {}).get(handle, UNKNOWN)

    def for_address(self, pid: int, addr: int) -> str:
        """Name of a runtime launch's host stub address, symbolized once and cached."""
        table = self._by_pid.setdefault(pid, {})
        name = table.get(addr)
        if name is None:
            name = demangle(self._symbolize(pid, addr) or UNKNOWN)
            if len(table) < _MAX_PER_PROCESS:
                table[addr] = name
        return name

    def forget(self, pid: int) -> None:
        """Drop a process' cache (it exited)."""
        self._by_pid.pop(pid, None)
