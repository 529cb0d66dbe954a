"""Which processes are traced and which of their libraries carry probes, kept current.

A full /proc scan runs every scan_interval_s; a traced process that opens a watched library
(the BPF open watch) is handled at once, while it is held (SIGSTOP, with gating) so its first
call is traced, and rescanned a few times after, since the mmap follows the openat. With probes
scoped to processes, a traced process's new child is held the same way at its birth until its
libraries are linked, and an exited process's links are closed. An exec
makes a process another program; a process that is gone is forgotten. Each traced process gets
its OTel resource and, while it lives, its symbol cache (launches named by host-stub symbol).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from opentelemetry.sdk.resources import Resource

from otel_eacgm.attach import Attacher
from otel_eacgm.bpf_program import CallProgram
from otel_eacgm.events import ExecEvent, LibOpenEvent
from otel_eacgm.kernel_names import KernelNames
from otel_eacgm.probes.libraries import all_pids, cgroup_pids, family_of, libraries_of, resolve
from otel_eacgm.process_symbols import ProcessSymbols
from otel_eacgm.procfs import stat_fields
from otel_eacgm.resources import process_resource

log = logging.getLogger(__name__)

RESCAN_DELAYS_S = (0.0, 0.05, 0.3, 1.0)
"""Rescans of a process after it opened a watched library: the mmap follows the openat."""


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot, /proc/PID/stat field 22); None once it is gone."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields is not None else None


class Discovery:
    """Finds traced processes and their libraries, and keeps each process' resource and symbols.

    `filtering`: only the program's targets (pids, cgroup, a launched command) are traced, else
    every process on the node. `on_gone(pid, now)` is told of each process that exited.
    """

    def __init__(self, *, program: CallProgram, attacher: Attacher, symbols: ProcessSymbols,
                 kernel_names: KernelNames, filtering: bool, cgroup: str | None, host_name: str,
                 resource_command_line: bool, resource_environment: list[str],
                 on_gone: Callable[[int, float], None] | None) -> None:
        self._program = program
        self.attacher = attacher
        self.symbols = symbols
        self._kernel_names = kernel_names
        self.filtering = filtering
        self._cgroup = cgroup
        self._host = host_name
        self._command_line = resource_command_line
        self._environment = resource_environment
        self._on_gone = on_gone
        self._resources: dict[int, Resource] = {}
        self._pending: list[tuple[float, int]] = []  # (when, pid) rescans after a library open
        self._started: dict[int, int] = {}  # pid -> its start time (clock ticks after boot) when scanned

    def resource_for(self, pid: int) -> Resource:
        """The OTel resource of a traced process, read once (and again after an exec)."""
        res = self._resources.get(pid)
        if res is None:
            res = self._resources[pid] = process_resource(
                pid, host_name=self._host, command_line=self._command_line, environment=self._environment)
            self.symbols.track(pid)  # its map, read while it lives, names its launches
        return res

    def known_resource(self, pid: int) -> Resource | None:
        """The resource of a process already seen, None otherwise (never reads /proc: a process
        that has exited must not be looked up again)."""
        return self._resources.get(pid)

    def is_target(self, pid: int) -> bool:
        """Whether `pid` is traced (per-process host metrics follow the traced processes)."""
        return pid in self._program.targets()

    def scan(self, pids: set[int]) -> None:
        """Attach to the watched libraries these processes map (once per file; scoped, once per
        file and process)."""
        me = os.getpid()
        for pid in pids:
            if pid == me:
                continue
            self._check_same_process(pid)
            libs = libraries_of(pid)
            if libs:
                self.resource_for(pid)
            for lib in libs:
                self.attacher.ensure(lib, pid)

    def scan_all(self, now: float) -> None:
        """The periodic full scan: every candidate process, then forget those gone."""
        self.scan(self._candidates())
        self._prune(now)

    def _check_same_process(self, pid: int) -> None:
        """A pid that exited and came back between two scans is another process: the links,
        resource and symbols of the one that exited must not stand for it (scoped links name a
        task, and would never fire in the new one)."""
        started = start_time(pid)
        before = self._started.get(pid)
        if before is not None and started is not None and started != before:
            self._forget(pid)
        if started is not None:
            self._started[pid] = started

    def rescan_due(self, now: float) -> None:
        """Rescan processes whose library open is due for it; read their maps while they live."""
        due = {pid for t, pid in self._pending if t <= now}
        if not due:
            return
        self._pending = [(t, pid) for t, pid in self._pending if t > now]
        self.scan(due)
        for pid in due:
            self.symbols.refresh(pid)

    def on_library_open(self, rec: LibOpenEvent, now: float) -> None:
        """A traced process opened a watched library: attach to it now, then let the process go on."""
        pid = rec.pid
        self.resource_for(pid)
        # Read its map now, while it lives (stopped, if gated): what it mapped before this
        # library holds the host stubs of the launches to come (the library itself is mapped
        # after the open, and read at the rescans).
        self.symbols.refresh(pid)
        path = rec.path.decode(errors="replace")
        if not path.startswith("/"):
            try:
                path = os.path.join(os.readlink(f"/proc/{pid}/cwd"), path)
            except OSError:
                pass
        family = family_of(path)
        if family is not None:
            lib = resolve(pid, os.path.normpath(path), family)
            if lib is not None:
                self.attacher.ensure(lib, pid)
        # What it mapped before is linked too while it is held: a process new to the scope (a
        # cgroup member, a program just executed) has no file linked yet with scoped probes, and
        # an interpreter mapped at start has its frames read from the first call the new
        # library's probes see (libpython's own open came before its mmap).
        self.scan({pid})
        if rec.gated:
            self._program.let_go(pid)
        self._pending.extend((now + d, pid) for d in RESCAN_DELAYS_S)

    def on_fork_held(self, rec: ExecEvent) -> None:
        """A traced process's new child, stopped as it returned from the fork (probes scoped to
        processes, bpf/calls/process.bpf.h): it maps what its parent mapped, with its parent's
        breakpoints but none of its links. Link its libraries, then let it run: its first call is traced."""
        pid = rec.pid
        try:
            self.scan({pid})
        finally:
            self._program.let_go(pid)

    def on_exec(self, rec: ExecEvent) -> None:
        """The process is another program now: kernel names resolved in its old image no
        longer hold, and a process the agent knew has its resource and memory map read again
        (while it lives). Without a pid filter every exec on the node arrives: the others wait
        until they make a call or open a watched library."""
        known = self._resources.pop(rec.pid, None) is not None
        self._kernel_names.forget(rec.pid)
        self.symbols.forget(rec.pid)
        if known:
            self.resource_for(rec.pid)
        if self.attacher.frames is not None:
            self.attacher.frames.forget(rec.pid)
            if known:  # an interpreter executable is mapped already: its frames from the first call
                self.scan({rec.pid})

    def _candidates(self) -> set[int]:
        if not self.filtering:
            return set(all_pids())
        if self._cgroup:
            for pid in cgroup_pids(Path(self._cgroup)) - self._program.targets():
                self._program.add_target(pid)
        return self._program.targets()

    def _prune(self, now: float) -> None:
        for pid in [p for p in self._resources if not os.path.exists(f"/proc/{p}")]:
            self._forget(pid)
            if self._on_gone is not None:
                self._on_gone(pid, now)
        for pid in [p for p in self._started if p not in self._resources]:
            del self._started[pid]

    def _forget(self, pid: int) -> None:
        """Forget a process that exited: its resource, symbols, frames and (scoped) links."""
        self._resources.pop(pid, None)
        if self.attacher.frames is not None:
            self.attacher.frames.forget(pid)
        self._kernel_names.forget(pid)
        self.symbols.forget(pid)
        self.attacher.forget_process(pid)

    def start(self) -> None:
        """The first scan, before the loop."""
        self.scan(self._candidates())
