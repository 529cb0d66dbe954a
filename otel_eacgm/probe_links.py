"""Probe links: which probes of which file are attached, as groups that attach, detach and
re-attach together, and their release when the agent exits.

A group is one uprobe_multi link per direction where the kernel has them (6.6+: attached and
released with one kernel synchronisation, cheap enough for the overhead guardrail to cycle), else
one perf-event uprobe per probe. The BCC side of attaching (programs, perf events, symbol
offsets) is bpf_program.CallProgram's; this module decides what is attached where and when.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import errno
import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from otel_eacgm import uprobe_multi
from otel_eacgm.bpf_program import BpfError, CallProgram, ProcessGone, Tail

log = logging.getLogger(__name__)

_DETACHED_RELEASE_MIN = 8  # probes or links; fewer are released in the agent (see ProbeLinks.release)

#: The name (comm) of the child that releases an exited agent's probes.
RELEASER_NAME = "eacgm-release"


def _set_process_name(name: str) -> None:
    """prctl(PR_SET_NAME): how other agents tell a releasing child apart (see releases_running)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode(), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def releases_running(proc: Path = Path("/proc")) -> bool:
    """Whether an earlier agent's probes are still being released. Detaching and re-attaching a
    probe while another agent's probes on the same function are being released was seen to
    leave the re-attached probe silent (kernel 6.18), so the guardrail waits for them."""
    for comm in proc.glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == RELEASER_NAME:
                return True
        except OSError:
            continue
    return False


class GroupKind(str, enum.Enum):
    """What a group of probes is, which says whether the guardrail may cycle it."""

    CALLS = "calls"            # catalog rows with a return probe: entries and uretprobes
    ENQUEUE = "enqueue"        # entries of cyclable catalog rows with a return probe (memsets, D2D copies)
    ENQUEUE_RETURN = "enqueue.return"  # their uretprobes
    LAUNCH = "launch"          # entry-only catalog rows (kernel launches)
    TORCH = "torch"            # operator entries
    TORCH_EXIT = "torch.exit"  # operator returns (uprobes at their return instructions)
    PYTHON = "python"          # CPython's function__entry/function__return USDT probes


_EXIT_KINDS = frozenset({GroupKind.TORCH_EXIT, GroupKind.ENQUEUE_RETURN})  # returns of entries grouped apart
_ENTRY_KINDS = frozenset(GroupKind) - _EXIT_KINDS


@dataclasses.dataclass(frozen=True)
class Probe:
    """One probe point of a file."""

    offset: int
    tail: Tail
    slot: int = 0
    retprobe: bool = False   # a uretprobe of the function at offset, not a uprobe there
    ref_ctr_offset: int = 0  # file offset of a USDT semaphore (0: none)


@dataclasses.dataclass(frozen=True)
class Group:
    """Probes of one file attached, detached and re-attached together."""

    kind: GroupKind
    path: str
    pid: int = -1  # fire only in this process (-1: every process the filter admits)


@dataclasses.dataclass
class _Attached:
    """A group's probes, and how they are attached now (no handles: detached)."""

    probes: tuple[Probe, ...]
    handles: list[int | str] = dataclasses.field(default_factory=list)  # link fds, or perf event names
    wanted: bool = True  # attached unless paused (detach/reattach set it; pause/resume keep it)


class Detached:
    """What a detach took off, and when its probes stopped firing.

    A link's probes stop when its close begins (the kernel removes the breakpoints first, then
    synchronises), and the closer thread begins it some time after detach() returned: behind
    the closes queued before it, each with its synchronisation (tens of milliseconds), and
    behind the agent's loop for the interpreter lock. The guardrail's attached phases last
    0.1-0.2 s at low duties, so taking detach()'s own time for their end made them look shorter
    than they were, and the counts extrapolated from them came out 5-19% high (docs/design.md).
    """

    def __init__(self, probes: int, closes: int, *, stopped: float | None = None) -> None:
        """`probes` taken off by `closes` closes still to begin (none: stopped at `stopped`, or now)."""
        self.probes = probes
        self._pending = closes
        self._stopped: float | None = None if closes else (time.monotonic() if stopped is None else stopped)
        self._lock = threading.Lock()

    def closing(self, t: float) -> None:
        """One of its closes began at `t` (monotonic seconds)."""
        with self._lock:
            self._pending -= 1
            self._stopped = t if self._stopped is None else max(self._stopped, t)

    @property
    def stopped_at(self) -> float | None:
        """When the last of its probes stopped firing; None while a close has yet to begin."""
        with self._lock:
            return self._stopped if self._pending <= 0 else None


class _LinkCloser:
    """Closes link fds on a thread of its own. Closing a link removes its breakpoints at once and
    then waits for the kernel's synchronisation (tens of milliseconds, more on a busy host): the
    guardrail detaches links every period, and the agent's loop, which drains the ring buffer,
    must not wait for that."""

    def __init__(self) -> None:
        self._fds: queue.Queue[tuple[int, Detached | None]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="eacgm-link-closer", daemon=True)
        self._thread.start()

    def close(self, fd: int, detached: Detached | None = None) -> None:
        """Close `fd` soon; `detached` learns when its close began."""
        self._fds.put((fd, detached))

    def drain(self) -> None:
        """Wait until every fd handed over is closed."""
        self._fds.join()

    def _run(self) -> None:
        while True:
            fd, detached = self._fds.get()
            if detached is not None:
                detached.closing(time.monotonic())
            try:
                os.close(fd)
            except OSError as exc:
                log.warning("closing probe link fd %d failed: %s", fd, exc)
            finally:
                self._fds.task_done()


class ProbeLinks:
    """The probes attached to the call program, by group."""

    def __init__(self, program: CallProgram) -> None:
        self._program = program
        self._groups: dict[Group, _Attached] = {}
        self._closer = _LinkCloser()
        self._paused = False
        self._kind_wanted: dict[GroupKind, bool] = {}  # what detach/reattach last asked of each kind

    @property
    def multi_links(self) -> bool:
        """Probes are attached as uprobe_multi links: a group detaches and re-attaches with one
        kernel synchronisation, cheap enough for the guardrail to cycle operator probes."""
        return self._program.multi_prog_fd >= 0

    def attach(self, group: Group, probes: Sequence[Probe], *, label: str = "") -> None:
        """Attach `probes` of `group.path` as (part of) `group`: all of them, or none and BpfError."""
        if not probes:
            return
        entry = self._groups.setdefault(group, _Attached(()))
        wanted = self._kind_wanted.get(group.kind, True)
        if (self._paused or not wanted) and not entry.handles:
            # attached by resume() or reattach(), whichever comes last: a group new while its kind
            # is detached by the guardrail (a new process's, with scoped probes) stays off with it
            if not entry.probes:
                entry.wanted = wanted
            entry.probes += tuple(probes)
            return
        try:
            handles, attached = self._attach_now(group, probes)
            entry.handles += handles
            entry.probes += tuple(attached)
        except BpfError as exc:
            raise type(exc)(f"{label or group.kind.value}: {exc}") from None

    def _link(self, group: Group, probes: Sequence[Probe], retprobe: bool) -> int:
        refs = tuple(p.ref_ctr_offset for p in probes)
        return uprobe_multi.create(self._program.multi_prog_fd, uprobe_multi.LinkSpec(
            path=group.path, offsets=tuple(p.offset for p in probes),
            cookies=tuple(uprobe_multi.cookie(p.slot, p.tail) for p in probes),
            ref_ctr_offsets=refs if any(refs) else (), retprobe=retprobe, pid=group.pid))

    def _attach_now(self, group: Group, probes: Sequence[Probe]) -> tuple[list[int | str], list[Probe]]:
        """Handles of what was attached, and the probes it covers (with links, a probe another
        tool's probe refuses is left out; see _link_each)."""
        if self.multi_links:
            handles: list[int | str] = []
            attached: list[Probe] = []
            for retprobe in (False, True):
                part = [p for p in probes if p.retprobe == retprobe]
                if not part:
                    continue
                try:
                    handles.append(self._link(group, part, retprobe))
                    attached += part
                except uprobe_multi.LinkError as exc:
                    if exc.errno == errno.ESRCH and group.pid != -1:
                        self._close_handles(handles)
                        raise ProcessGone(f"{exc} (pid {group.pid} has exited)") from None
                    try:
                        if len(part) == 1:
                            raise BpfError(f"{exc}; see the kernel log (dmesg)") from None
                        each, linked = self._link_each(group, part, retprobe, exc)
                        handles += each
                        attached += linked
                    except BpfError:
                        self._close_handles(handles)
                        raise
            return handles, attached
        names: list[int | str] = []
        for p in probes:
            try:
                names.append(self._attach_perf(group, p))
            except BpfError as exc:
                self._close_handles(names)
                if group.pid != -1 and not os.path.exists(f"/proc/{group.pid}"):
                    raise ProcessGone(f"{exc} (pid {group.pid} has exited)") from None
                raise
        return names, list(probes)

    def _link_each(self, group: Group, probes: Sequence[Probe], retprobe: bool,
                   exc: OSError) -> tuple[list[int | str], list[Probe]]:
        # One refused offset refuses the whole link. The usual cause is another tool's uprobe on
        # the same instruction registered with a different USDT semaphore offset (BCC 0.26's
        # attach_uprobe passes an uninitialised one; dmesg: "ref_ctr_offset mismatch"): the
        # kernel allows one per instruction. Link the probes one by one and give up only on those.
        handles: list[int | str] = []
        linked, refused = [], []
        for p in probes:
            try:
                handles.append(self._link(group, [p], retprobe))
                linked.append(p)
            except uprobe_multi.LinkError:
                refused.append(p)
        if len(refused) == len(probes):
            raise BpfError(f"{exc}; see the kernel log (dmesg)")
        log.warning("%s: %d of %d probes refused (%s; another tool's probe on the same instruction? see dmesg), "
                    "the others attached one link each", group.path, len(refused), len(probes), exc.strerror)
        return handles, linked

    def _attach_perf(self, group: Group, p: Probe) -> str:
        return self._program.attach_perf_uprobe(p.tail, p.slot, group.path, p.offset, pid=group.pid,
                                                retprobe=p.retprobe, ref_ctr_offset=p.ref_ctr_offset)

    def _close_handles(self, handles: Sequence[int | str], detached: Detached | None = None) -> None:
        for h in handles:
            if isinstance(h, int):
                self._closer.close(h, detached)
            else:
                if detached is not None:  # removed before detach_perf_uprobe waits in the kernel
                    detached.closing(time.monotonic())
                try:
                    self._program.detach_perf_uprobe(h)
                except BpfError as exc:  # the probe stays attached
                    log.warning("%s", exc)

    def forget(self, group: Group) -> None:
        """Detach a group for good (its partner group failed to attach)."""
        entry = self._groups.pop(group, None)
        if entry is not None:
            self._close_handles(entry.handles)

    def forget_process(self, pid: int) -> int:
        """Close the links scoped to `pid` (it exited: a link holds its task and its probes'
        registrations in the kernel until closed); returns the probes they held."""
        groups = [group for group in self._groups if group.pid == pid and pid != -1]
        n = 0
        for group in groups:
            entry = self._groups.pop(group)
            n += len(entry.probes)
            self._close_handles(entry.handles)
        return n

    @property
    def link_count(self) -> int:
        """Handles held now: uprobe_multi link fds, or perf events."""
        return sum(len(entry.handles) for entry in self._groups.values())

    def detach(self, kind: GroupKind) -> Detached:
        """Detach every group of `kind` (the guardrail's off phase): what was taken off, and when
        it stopped firing. A probe stops as soon as its breakpoint is removed, which comes first;
        the kernel's synchronisation after it is what takes time (one per link, or one per perf
        probe)."""
        self._kind_wanted[kind] = False
        for group, entry in self._groups.items():
            if group.kind is kind:
                entry.wanted = False
        groups = [entry for group, entry in self._groups.items() if group.kind is kind and entry.handles]
        detached = Detached(sum(len(e.probes) for e in groups), sum(len(e.handles) for e in groups))
        for entry in groups:
            handles, entry.handles = entry.handles, []
            self._close_handles(handles, detached)
        return detached

    def reattach(self, kind: GroupKind) -> int:
        """Attach again what detach(kind) took off (when resumed, if paused); returns the probes attached.
        Waits for closes still queued: the old link and its replacement must not fire together."""
        self._closer.drain()
        self._kind_wanted[kind] = True
        n = 0
        gone = []
        for group, entry in self._groups.items():
            if group.kind is not kind:
                continue
            entry.wanted = True
            if not entry.handles and not self._paused:
                try:
                    entry.handles, attached = self._attach_now(group, entry.probes)
                    entry.probes = tuple(attached)
                    n += len(attached)
                except ProcessGone:  # a process-scoped group whose process exited while detached
                    gone.append(group)
                except BpfError as exc:
                    log.warning("re-attaching %s probes of %s failed: %s", kind.value, group.path, exc)
        for group in gone:
            del self._groups[group]
        return n

    def pause(self) -> int:
        """Detach every probe until resume(), whatever detach/reattach ask meanwhile (the paired
        overhead measurement, pause_cycle.py); returns once they have stopped firing and the
        kernel has synchronised, with the probes detached."""
        self._paused = True
        n = 0
        for kinds in (_ENTRY_KINDS, _EXIT_KINDS):  # entries first: a call is seen whole or not at all
            for group, entry in self._groups.items():
                if group.kind in kinds and entry.handles:
                    handles, entry.handles = entry.handles, []
                    self._close_handles(handles)
                    n += len(entry.probes)
        self._closer.drain()
        return n

    def resume(self) -> int:
        """Attach again what pause() took off and is wanted (returns first); returns the probes attached."""
        self._paused = False
        n = 0
        gone = []
        for kinds in (_EXIT_KINDS, _ENTRY_KINDS):
            for group, entry in self._groups.items():
                if group.kind in kinds and entry.wanted and not entry.handles and group not in gone:
                    try:
                        entry.handles, attached = self._attach_now(group, entry.probes)
                        entry.probes = tuple(attached)
                        n += len(attached)
                    except ProcessGone:  # a process-scoped group whose process exited while paused
                        gone.append(group)
                    except BpfError as exc:
                        log.warning("resuming %s probes of %s failed: %s", group.kind.value, group.path, exc)
        for group in gone:
            del self._groups[group]
        return n

    def drop(self, kind: GroupKind, slots: set[int]) -> Detached:
        """Take the probes of `slots` out of every group of `kind` for good (operator shedding):
        what was dropped, and when the old links stopped firing. An attached group is linked
        again without them, the new link made before the old one is closed, so no call of a kept
        probe goes unseen: an entry hit by both links is one frame (the kernel drops the second,
        same stack pointer within microseconds), and of a return seen twice the second finds no
        frame of its own (a returns-without-entry gap, which the caller marks until then)."""
        dropped = 0
        old_links: list[int | str] = []
        for group, entry in self._groups.items():
            keep = tuple(p for p in entry.probes if p.slot not in slots)
            if group.kind is not kind or len(keep) == len(entry.probes):
                continue
            dropped += len(entry.probes) - len(keep)
            old, entry.probes = entry.handles, keep
            if not old:  # detached by the guardrail or paused: attached later without them
                continue
            try:
                entry.handles, attached = self._attach_now(group, keep) if keep else ([], [])
                entry.probes = tuple(attached)
            except BpfError as exc:
                entry.handles = []
                log.warning("re-linking %s probes of %s without %d shed probes failed: %s", kind.value, group.path,
                            len(slots), exc)
            old_links += old
        detached = Detached(dropped, len(old_links))
        self._close_handles(old_links, detached)
        return detached

    @property
    def probe_count(self) -> int:
        """Uprobes plus uretprobes attached so far (those the guardrail has detached for now included)."""
        return sum(len(entry.probes) for entry in self._groups.values())

    def release(self) -> None:
        """Detach every probe: in the agent when few, else in a forked child that outlives it."""
        self._closer.drain()
        # Releasing a perf uprobe waits in the kernel (~0.1 s each, serialised), a uprobe_multi
        # link once for all its probes: a few hundred perf probes would hold the agent's exit
        # for a minute. A forked child inherits the probe and link fds and releases them after
        # the agent has exited; the agent's own copies close at once, since the child still
        # holds the probes. Until the child is done the probes stay attached, with nobody
        # reading their events.
        links = [h for entry in self._groups.values() for h in entry.handles if isinstance(h, int)]
        probes = self.probe_count
        events = self._program.perf_uprobe_fds()
        held = [fd for _, fd in events] + links
        if len(held) < _DETACHED_RELEASE_MIN:
            self._close_handles(links)
            self._closer.drain()
            self._groups.clear()
            return
        try:
            child = os.fork()
        except OSError as exc:
            log.warning("releasing %d probes in the agent (fork failed: %s)", len(held), exc)
            return
        if child == 0:  # the releasing child: no Python cleanup, no output, no signal from the terminal
            try:
                os.setsid()
                _set_process_name(RELEASER_NAME)
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
                for fd in held:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            finally:
                os._exit(0)
        for fd in held:
            try:
                os.close(fd)
            except OSError:
                pass
        self._program.disown_perf_uprobes([name for name, _ in events])  # closed above
        self._groups.clear()
        log.info("%d probes (%d links, %d perf events) are released by pid %d in the background",
                 probes, len(links), len(events), child)
