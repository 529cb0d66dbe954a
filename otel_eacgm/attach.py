"""Attaching probes to each distinct library file, once: catalog rows by symbol, discovered
ATen operators and CPython's function probes by file offset. What goes in which group is
planned as data (attach_plan.py); this module applies the plans through the probe links and
keeps the report of what was attached, missing or refused."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, MutableMapping, Sequence

from otel_eacgm.attach_plan import Pair, plan_catalog, plan_operators, plan_python
from otel_eacgm.bpf_program import BpfError, CallProgram, ProcessGone, SymbolMissing
from otel_eacgm.probe_links import Group, GroupKind, Probe, ProbeLinks
from otel_eacgm.probes import python_usdt, torch_ops
from otel_eacgm.probes.catalog import TORCH_SLOTS, Family, ProbeSpec, torch_spec
from otel_eacgm.probes.elf import ElfError
from otel_eacgm.probes.libraries import MappedLibrary
from otel_eacgm.pyframes.processes import FrameWalkers
from otel_eacgm.short_lived import ShortLivedProcesses

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TorchSelection:
    """Which ATen operators to probe (config torch_include / torch_exclude / torch_max_ops)."""

    include: tuple[str, ...] = torch_ops.DEFAULT_INCLUDE
    exclude: tuple[str, ...] = torch_ops.DEFAULT_EXCLUDE
    max_ops: int = len(TORCH_SLOTS)


@dataclasses.dataclass(frozen=True)
class _FilePlan:
    """What one library file gets, planned once and linked once per file (or, scoped, per process)."""

    label: str                                               # its family, for log lines
    groups: tuple[tuple[GroupKind, tuple[Probe, ...]], ...]  # attached one by one, each on its own
    pairs: tuple[Pair, ...]                                  # cycled pairs, returns first
    names: Callable[[Sequence[Probe]], list[str]]            # the functions of probes, for the report
    operators: int | None = None                             # ATen operators it probes (torch)


class Attacher:
    """Remembers which files carry probes; attaches a family's rows to each new file.

    `specs` is the agent's slot -> ProbeSpec table; discovered operators are added to it.
    `scoped`: link the catalog and operator probes per traced process (the kernel then places
    breakpoints only in that process's memory, so a process outside the scope that maps the same
    file takes no trap); else once per file, where every process mapping it traps.
    `python_pid_scoped`: attach Python probes per traced process (a system-wide Python probe
    would make every Python process on the host pay a probe hit per function call).
    `frames`: walk the Python frames of processes whose interpreter it can read; the USDT
    probes then stay off that interpreter (the walk names the same functions, without them).
    """

    def __init__(self, program: CallProgram, links: ProbeLinks, rows: Iterable[tuple[int, ProbeSpec]], *,
                 specs: MutableMapping[int, ProbeSpec] | None = None, torch: TorchSelection | None = None,
                 python: bool = False, python_pid_scoped: bool = True, frames: FrameWalkers | None = None,
                 scoped: bool = False) -> None:
        self._program = program
        self._links = links
        self._rows = list(rows)
        self._rows_by_slot = dict(self._rows)
        self._files: dict[tuple[int, int], str] = {}
        self._scoped = scoped
        self._plans: dict[tuple[int, int], _FilePlan] = {}       # file -> its probes, planned once
        self._linked: set[tuple[tuple[int, int], int]] = set()   # (file, pid or -1) with links
        self.missing: dict[str, list[str]] = {}
        self.failed: dict[str, list[str]] = {}
        self._specs = specs if specs is not None else {}
        self._torch = torch
        self._torch_slots: dict[str, int] = {}
        self._python = python
        self._python_pid_scoped = python_pid_scoped
        self.frames = frames
        self._python_files: dict[tuple[tuple[int, int], int], str] = {}
        self._python_regs: tuple[int, int, int] | None = None
        self.python_without_usdt: dict[str, str] = {}  # interpreter path -> why it has no function probes
        self.torch_ops: dict[str, int] = {}             # library path -> operators probed
        self.short_lived = ShortLivedProcesses()        # processes gone before their probes were linked

    @property
    def files(self) -> dict[tuple[int, int], str]:
        """(dev, inode) -> path of every file with probes."""
        return dict(self._files)

    def ensure(self, lib: MappedLibrary, pid: int = -1) -> int:
        """Attach to `lib` (mapped by `pid`) unless it already has probes (scoped: in that
        process); returns probes added."""
        if lib.family is Family.PYTHON:
            if self.frames is not None and (self.frames.register(lib, pid) or self.frames.knows(lib)):
                return 0
            return self._ensure_python(lib, pid) if self._python else 0
        if lib.family is Family.TORCH and self._torch is None:
            return 0
        scope = pid if self._scoped else -1
        if (lib.file_key, scope) in self._linked:
            return 0
        first = lib.file_key not in self._files
        self._files[lib.file_key] = lib.path
        plan = self._plans.get(lib.file_key)
        if plan is None:
            plan = self._plans[lib.file_key] = self._plan_torch(lib) if lib.family is Family.TORCH \
                else self._plan_catalog(lib)
        self._linked.add((lib.file_key, scope))
        before = self._links.probe_count
        try:
            failed = self._link(lib.path, plan, scope)
        except ProcessGone as exc:
            self.forget_process(scope)
            self.short_lived.note(pid, lib.path, exc)
            return 0
        added = self._links.probe_count - before
        if failed:
            self.failed[lib.path] = sorted(set(self.failed.get(lib.path, [])) | set(failed))
        if first and plan.operators is not None:
            self.torch_ops[lib.path] = plan.operators - len(failed)
        log.log(logging.INFO if first else logging.DEBUG, "attached %d probes to %s (%s)%s", added, lib.path,
                plan.label, f" for pid {pid}" if scope != -1 else "")
        return added

    def forget_process(self, pid: int) -> int:
        """`pid` has exited: close its scoped links (none unless scoped); returns the probes they held."""
        self._linked = {key for key in self._linked if key[1] != pid}
        return self._links.forget_process(pid)

    def _link(self, path: str, plan: _FilePlan, scope: int) -> list[str]:
        """Link `plan` on `path` for `scope`; the names of the functions whose probes failed."""
        failed: list[str] = []
        for kind, probes in plan.groups:
            try:
                self._links.attach(Group(kind, path, scope), probes, label=f"{plan.label} {kind.value} probes")
            except ProcessGone:
                raise
            except BpfError as exc:
                failed += plan.names(probes)
                log.error("%s", exc)
        for pair in plan.pairs:
            if not self._attach_pair(path, plan.label, pair, scope):
                failed += plan.names(pair.entries[1])
        return failed

    def _plan_catalog(self, lib: MappedLibrary) -> _FilePlan:
        plan = plan_catalog(self._rows, lib.family, lambda symbol: self._offset(lib.path, symbol))
        if plan.missing:
            self.missing[lib.path] = list(plan.missing)
            log.info("%s: %d symbols not in this version, skipped: %s", lib.path, len(plan.missing),
                     ", ".join(plan.missing))
        return _FilePlan(lib.family.value, plan.groups, (plan.enqueues,) if plan.enqueues is not None else (),
                         lambda probes: sorted({self._rows_by_slot[p.slot].symbol for p in probes}))

    def _offset(self, path: str, symbol: str) -> int | None:
        try:
            return self._program.resolve(path, symbol)
        except SymbolMissing:
            return None

    def _attach_pair(self, path: str, label: str, pair: Pair, scope: int = -1) -> bool:
        """Attach a cycled pair, returns first; if either fails, the returns are taken off again
        (returns without entries cost hits and trace nothing); False then."""
        for kind, probes in (pair.returns, pair.entries):
            try:
                self._links.attach(Group(kind, path, scope), probes, label=f"{label} {kind.value} probes")
            except BpfError as exc:
                self._links.forget(Group(pair.returns[0], path, scope))
                if isinstance(exc, ProcessGone):
                    raise
                log.error("%s", exc)
                return False
        return True

    # --- PyTorch operators ----------------------------------------------------------------
    def _slot_for(self, op: torch_ops.TorchOp) -> int | None:
        slot = self._torch_slots.get(op.struct)
        if slot is None:
            if len(self._torch_slots) >= len(TORCH_SLOTS):
                return None
            slot = self._torch_slots[op.struct] = TORCH_SLOTS[len(self._torch_slots)]
            spec = torch_spec(op.name, op.overload)
            self._specs[slot] = spec
            self._program.configure(slot, spec)
        return slot

    def _plan_torch(self, lib: MappedLibrary) -> _FilePlan:
        assert self._torch is not None
        none = _FilePlan("torch", (), (), lambda _probes: [], operators=0)
        try:
            ops = torch_ops.discover(lib.path, lib.file_key)
        except (OSError, ElfError) as exc:
            self.failed[lib.path] = ["at::_ops::*::call"]
            log.error("%s: cannot read its operator symbols: %s", lib.path, exc)
            return none
        cap = min(self._torch.max_ops, len(TORCH_SLOTS))
        chosen, dropped = torch_ops.select(ops, self._torch.include, self._torch.exclude, cap)
        try:
            chosen = torch_ops.with_exits(lib.path, chosen)
        except (torch_ops.NoExits, OSError, ElfError) as exc:
            self.failed[lib.path] = ["at::_ops::*::call"]
            log.error("%s: PyTorch operators not traced: %s", lib.path, exc)
            return none
        if dropped:
            log.info("%s: %d operators match torch_include, the cap torch_max_ops=%d keeps %d; %d not traced "
                     "(raise torch_max_ops, at most %d, or narrow torch_include)", lib.path,
                     len(chosen) + dropped, self._torch.max_ops, len(chosen), dropped, len(TORCH_SLOTS))
        pair, unslotted = plan_operators(chosen, self._slot_for)
        if unslotted:
            self.failed[lib.path] = [op.qualified for op in unslotted]
        by_slot = {slot: op.qualified for op in chosen if (slot := self._torch_slots.get(op.struct)) is not None}
        log.info("%s: %d of %d operators chosen for probes", lib.path, len(chosen) - len(unslotted), len(ops))
        return _FilePlan("torch", (), (pair,), lambda probes: sorted({by_slot[p.slot] for p in probes}),
                         operators=len(chosen) - len(unslotted))

    # --- Python functions -----------------------------------------------------------------
    def _ensure_python(self, lib: MappedLibrary, pid: int) -> int:
        scope = pid if self._python_pid_scoped else -1
        key = (lib.file_key, scope)
        if key in self._python_files or lib.path in self.python_without_usdt:
            return 0
        self._python_files[key] = lib.path
        try:
            probes = python_usdt.find_probes(lib.path)
        except python_usdt.UsdtError as exc:
            self.python_without_usdt[lib.path] = str(exc)
            log.warning("Python functions are not traced in processes of %s: %s; the other layers are",
                        lib.path, exc)
            return 0
        if "python3.11" in lib.path.rsplit("/", 1)[-1]:
            log.warning("%s: %s", lib.path, python_usdt.CPYTHON_311_NOTE)
        if self._python_regs is None:
            self._python_regs = probes.arg_regs
            self._program.configure_python(probes.arg_regs)
        elif self._python_regs != probes.arg_regs:
            reason = (f"its function probes keep their arguments in other registers ({probes.arg_regs}) than "
                      f"the first interpreter's ({self._python_regs}); one layout per agent is supported")
            self.python_without_usdt[lib.path] = reason
            log.warning("Python functions are not traced in %s: %s", lib.path, reason)
            return 0
        before = self._links.probe_count
        try:
            self._links.attach(Group(GroupKind.PYTHON, lib.path, scope), plan_python(probes),
                               label="python:function__entry/function__return")
        except ProcessGone as exc:
            del self._python_files[key]
            self.short_lived.note(pid, lib.path, exc)
            return 0
        except BpfError as exc:
            self.failed[lib.path] = ["python:function__entry"]
            log.error("%s", exc)
        added = self._links.probe_count - before
        log.info("attached %d Python function probes to %s%s", added, lib.path,
                 f" for pid {pid}" if scope != -1 else "")
        return added
