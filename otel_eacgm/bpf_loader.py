"""The agent's only contact with BCC: compile bpf/calls.bpf.c, attach probes, read maps.

Knobs reach the BPF program as -D flags, never by editing its text. Everything that can fail
in the kernel or in BCC is turned into a typed exception here, so the rest of the agent never
sees BCC's generic ``Exception``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from otel_eacgm import uprobe_multi
from otel_eacgm.bpf import SOURCE_DIR
from otel_eacgm.events import MAX_ARGS, MAX_DEPTH, PY_RULES, CallEvent, PyRule, Stat
from otel_eacgm.probes.catalog import MAX_SLOTS, ProbeSpec

log = logging.getLogger(__name__)

BPF_DIR = SOURCE_DIR
_DETACHED_RELEASE_MIN = 8  # probes or links; fewer are released in the agent (see CallProgram._release)


#: Most ring-buffer records one poll consumes (about 0.1-0.2 s of the agent's Python).
POLL_BATCH = 2048

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


class BpfError(RuntimeError):
    """The BPF program could not be compiled, loaded or attached."""


class SymbolMissing(BpfError):
    """A catalog symbol is not in this library version (skipped, never fatal)."""


class Tail(enum.IntEnum):
    """calls.bpf.c's eacgm_tail: the common program a probe runs."""

    ENTRY = 0
    RETURN = 1
    PY_ENTRY = 3
    PY_RETURN = 4


class GroupKind(str, enum.Enum):
    """What a group of probes is, which says whether the guardrail may cycle it."""

    CALLS = "calls"            # catalog rows with a return probe: entries and uretprobes
    ENQUEUE = "enqueue"        # entries of cyclable catalog rows with a return probe (memsets, D2D copies)
    ENQUEUE_RETURN = "enqueue.return"  # their uretprobes
    LAUNCH = "launch"          # entry-only catalog rows (kernel launches)
    TORCH = "torch"            # operator entries
    TORCH_EXIT = "torch.exit"  # operator returns (uprobes at their return instructions)
    PYTHON = "python"          # CPython's function__entry/function__return USDT probes


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


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Run-time knobs of calls.bpf.c: which calls become spans (struct sample_conf)."""

    ratio: float        # share of time slices whose calls are sent as spans
    slow_s: float       # calls at least this long are always sent
    slice_s: float      # one thread's time slice: the unit of sampling
    resample_s: float   # calls entered this long after their parent are decided afresh
    salt: int
    statistics: bool    # aggregate call statistics in the kernel
    slice_max: int      # spans one thread may send in one sampled slice (0: no cap)


@dataclasses.dataclass(frozen=True)
class CallStat:
    """One call_stats entry: the calls of one process, probe, outcome and key (kernel, communicator)."""

    pid: int
    probe_id: int
    status: int
    key: int
    count: int
    timed: int
    sum_ns: int
    bytes: int
    bw_sum: int
    bw_count: int
    dur: tuple[int, ...]
    bw: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class ProgramOptions:
    """Compile-time knobs of calls.bpf.c (see its header comment)."""

    filter_pids: bool
    uprobe_multi: bool = True  # one uprobe_multi link per group where the kernel has them (6.6+)
    follow_forks: bool = True
    gate_opens: bool = False
    ringbuf_pages: int = 1024
    agent_pid: int = dataclasses.field(default_factory=os.getpid)

    def cflags(self) -> list[str]:
        """The -D/-I flags for BCC."""
        if self.ringbuf_pages <= 0 or self.ringbuf_pages & (self.ringbuf_pages - 1):
            raise ValueError(f"ringbuf_pages {self.ringbuf_pages} must be a power of two")
        flags = [
            f"-I{BPF_DIR}",
            f"-DEACGM_PROBE_SLOTS={MAX_SLOTS}",
            f"-DEACGM_RINGBUF_PAGES={self.ringbuf_pages}",
            f"-DEACGM_AGENT_PID={self.agent_pid}",
        ]
        if self.filter_pids:
            flags.append("-DEACGM_FILTER_PIDS")
            if self.follow_forks:
                flags.append("-DEACGM_FOLLOW_FORKS")
            if self.gate_opens:
                flags.append("-DEACGM_GATE_OPENS")
        return flags


def import_bcc():  # noqa: ANN202 - bcc has no type information
    try:
        import bcc  # type: ignore[import-not-found]
    except ImportError as exc:
        raise BpfError(
            f"cannot import bcc ({exc}): install Debian's python3-bpfcc and run the agent with a "
            "Python that sees it (.venv is built with --system-site-packages for this)"
        ) from exc
    return bcc


class _LinkCloser:
    """Closes link fds on a thread of its own. Closing a link removes its breakpoints at once and
    then waits for the kernel's synchronisation (tens of milliseconds, more on a busy host): the
    guardrail detaches links every period, and the agent's loop, which drains the ring buffer,
    must not wait for that."""

    def __init__(self) -> None:
        self._fds: queue.Queue[int] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="eacgm-link-closer", daemon=True)
        self._thread.start()

    def close(self, fd: int) -> None:
        self._fds.put(fd)

    def drain(self) -> None:
        """Wait until every fd handed over is closed."""
        self._fds.join()

    def _run(self) -> None:
        while True:
            fd = self._fds.get()
            try:
                os.close(fd)
            except OSError as exc:
                log.warning("closing probe link fd %d failed: %s", fd, exc)
            finally:
                self._fds.task_done()


class CallProgram:
    """calls.bpf.c loaded into the kernel."""

    def __init__(self, options: ProgramOptions, *, dump: Callable[[str], None] | None = None) -> None:
        bcc = import_bcc()
        self._bcc = bcc
        self.options = options
        src = BPF_DIR / "calls.bpf.c"
        if dump is not None:
            dump(f"// cflags: {' '.join(options.cflags())}\n{src.read_text()}")
        try:
            self._bpf = bcc.BPF(src_file=str(src).encode(), cflags=options.cflags())
        except Exception as exc:  # BCC raises bare Exception for compile and load errors
            raise BpfError(
                f"loading {src} failed: {exc}. Run `otel-eacgm doctor` (kernel headers, root, BPF)."
            ) from exc
        self._groups: dict[Group, _Attached] = {}
        self._polled = 0
        self._closer = _LinkCloser()
        self._attach_offset_fn = None
        self._multi_fd = -1
        attach_type = -1
        if options.uprobe_multi:
            try:  # loaded first: the programs it tail-calls must be loaded with its attach type
                fd = self._bpf.load_func(b"multi_probe", bcc.BPF.KPROBE, None, uprobe_multi.BPF_TRACE_UPROBE_MULTI).fd
                if uprobe_multi.supported(fd):
                    self._multi_fd, attach_type = fd, uprobe_multi.BPF_TRACE_UPROBE_MULTI
                else:
                    log.info("this kernel has no uprobe_multi links (6.6+): one perf event per probe")
            except Exception as exc:  # BCC raises bare Exception when the verifier refuses a program
                log.info("uprobe_multi links not usable (%s): one perf event per probe", exc)
        try:  # the slot programs tail-call the shared entry/return code
            tails = self._bpf["tails"]
            for index, fn_name in ((0, b"slot_entry"), (1, b"slot_return"), (2, b"unwind"), (3, b"py_entry"),
                                   (4, b"py_return")):
                fn = self._bpf.load_func(fn_name, bcc.BPF.KPROBE, None, attach_type)
                tails[ctypes.c_int(index)] = ctypes.c_int(fn.fd)
        except Exception as exc:  # BCC raises bare Exception when the verifier refuses a program
            raise BpfError(f"loading the shared probe programs of {src} failed: {exc}") from exc

    @property
    def multi_links(self) -> bool:
        """Probes are attached as uprobe_multi links: a group detaches and re-attaches with one
        kernel synchronisation, cheap enough for the guardrail to cycle operator probes."""
        return self._multi_fd >= 0

    def configure(self, slot: int, spec: ProbeSpec) -> None:
        """Write a probe row's settings into probe_conf[slot]."""
        table = self._bpf["probe_conf"]
        table[ctypes.c_int(slot)] = table.Leaf(has_return=int(spec.has_return), exit_probes=int(spec.exit_probes),
                                                    returns_status=int(spec.returns_status),
                                                    always_send=int(spec.always_send),
                                                    deref_arg=spec.deref_arg, out_arg=spec.out_arg,
                                                    str_arg=spec.str_arg, key_arg=spec.key_arg,
                                                    count_arg=spec.count_arg, dtype_arg=spec.dtype_arg)

    def configure_python(self, usdt_regs: tuple[int, int, int]) -> None:
        """Where py_entry/py_return find function__entry's arguments (pt_regs byte offsets)."""
        table = self._bpf["py_conf"]
        leaf = table.Leaf(has_return=1, deref_arg=-1, out_arg=-1, str_arg=-1, key_arg=-1, count_arg=-1, dtype_arg=-1)
        for i, off in enumerate(usdt_regs):
            leaf.usdt_reg[i] = off
        table[ctypes.c_int(0)] = leaf

    def set_sampling(self, sampling: Sampling) -> None:
        """Which calls the kernel sends as spans, and whether it keeps call statistics."""
        table = self._bpf["sample_conf"]
        table[ctypes.c_int(0)] = table.Leaf(
            ratio=round(sampling.ratio * 65536), stats_on=int(sampling.statistics),
            slow_ns=int(sampling.slow_s * 1e9), slice_ns=int(sampling.slice_s * 1e9),
            resample_ns=int(sampling.resample_s * 1e9), salt=sampling.salt & (2**64 - 1),
            slice_max=sampling.slice_max)

    def call_stats(self) -> list[CallStat]:
        """Every call statistics entry (cumulative since the entry was made)."""
        out = []
        for k, v in self._bpf["call_stats"].items():
            out.append(CallStat(pid=k.pid, probe_id=k.probe_id, status=k.status, key=k.key, count=v.count,
                                timed=v.timed, sum_ns=v.sum_ns, bytes=v.bytes, bw_sum=v.bw_sum,
                                bw_count=v.bw_count, dur=tuple(v.dur), bw=tuple(v.bw)))
        return out

    def forget_stats(self, pids: set[int]) -> None:
        """Delete the statistics entries of exited processes (after their last export)."""
        table = self._bpf["call_stats"]
        for k in [k for k in table.keys() if k.pid in pids]:
            try:
                del table[k]
            except KeyError:
                pass

    def set_python_rules(self, rules: list[PyRule], names: dict[int, int]) -> None:
        """Replace the Python filter rules (first match wins; unused slots end the list) and the
        path component hashes they use (hash -> rule bits)."""
        table = self._bpf["py_names"]
        table.clear()
        for h, bits in names.items():
            table[ctypes.c_uint32(h)] = ctypes.c_uint64(bits)
        if len(rules) > PY_RULES:
            raise ValueError(f"{len(rules)} Python filter rules, at most {PY_RULES} fit (python_include/python_exclude)")
        table = self._bpf["py_rules"]
        for i in range(PY_RULES):
            rule = rules[i] if i < len(rules) else PyRule()
            leaf = table.Leaf()
            ctypes.memmove(ctypes.addressof(leaf), ctypes.addressof(rule), ctypes.sizeof(PyRule))
            table[ctypes.c_int(i)] = leaf

    def _offset_attacher(self):  # noqa: ANN202
        # BCC's Python binding declares bpf_attach_uprobe without its last parameter,
        # ref_ctr_offset (the USDT semaphore the kernel then raises in every process mapping the
        # file); call the C function through a prototype of its own instead.
        if self._attach_offset_fn is None:
            from bcc.libbcc import lib  # type: ignore[import-not-found]

            proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                                     ctypes.c_uint64, ctypes.c_int, ctypes.c_uint32)
            self._attach_offset_fn = proto(ctypes.cast(lib.bpf_attach_uprobe, ctypes.c_void_p).value)
        return self._attach_offset_fn

    def resolve(self, path: str, symbol: str) -> int:
        """The file offset of `symbol` in the library at `path`; raises SymbolMissing."""
        try:
            return int(self._bcc.BPF._check_path_symbol(path.encode(), symbol.encode(), None, -1)[1])  # noqa: SLF001
        except Exception:  # BCC raises bare Exception for an unknown symbol
            raise SymbolMissing(f"{symbol} not in {path}") from None

    def attach(self, group: Group, probes: Sequence[Probe], *, label: str = "") -> None:
        """Attach `probes` of `group.path` as (part of) `group`: all of them, or none and BpfError."""
        if not probes:
            return
        entry = self._groups.setdefault(group, _Attached(()))
        try:
            handles, attached = self._attach_now(group, probes)
            entry.handles += handles
            entry.probes += tuple(attached)
        except BpfError as exc:
            raise BpfError(f"{label or group.kind.value}: {exc}") from None

    def _link(self, group: Group, probes: Sequence[Probe], retprobe: bool) -> int:
        refs = tuple(p.ref_ctr_offset for p in probes)
        return uprobe_multi.create(self._multi_fd, uprobe_multi.LinkSpec(
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
            except BpfError:
                self._close_handles(names)
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
        fn_name = {Tail.ENTRY: f"entry_{p.slot}", Tail.RETURN: f"return_{p.slot}",
                   Tail.PY_ENTRY: "py_entry", Tail.PY_RETURN: "py_return"}[p.tail]
        fn = self._bpf.load_func(fn_name.encode(), self._bcc.BPF.KPROBE)
        name = group.path.encode()
        ev_name = self._bpf._get_uprobe_evname(b"r" if p.retprobe else b"p", name, p.offset, group.pid)  # noqa: SLF001
        fd = self._offset_attacher()(fn.fd, int(p.retprobe), ev_name, name, p.offset, group.pid, p.ref_ctr_offset)
        if fd < 0:
            raise BpfError(f"attaching {fn_name} at {group.path}+{p.offset:#x} failed "
                           f"(ref_ctr_offset {p.ref_ctr_offset:#x}); see the kernel log (dmesg)")
        self._bpf._add_uprobe_fd(ev_name, fd)  # noqa: SLF001 - so that cleanup() detaches it
        return ev_name.decode()

    def _close_handles(self, handles: Sequence[int | str]) -> None:
        for h in handles:
            if isinstance(h, int):
                self._closer.close(h)
            else:
                try:
                    self._bpf.detach_uprobe_event(h.encode())
                except Exception as exc:  # BCC raises bare Exception; the probe stays attached
                    log.warning("detaching %s failed: %s", h, exc)

    def forget(self, group: Group) -> None:
        """Detach a group for good (its partner group failed to attach)."""
        entry = self._groups.pop(group, None)
        if entry is not None:
            self._close_handles(entry.handles)

    def detach(self, kind: GroupKind) -> int:
        """Detach every group of `kind` (the guardrail's off phase); returns the probes detached.
        A probe stops firing as soon as its breakpoint is removed, which comes first; the kernel's
        synchronisation after it is what takes time (one per link, or one per perf probe)."""
        n = 0
        for group, entry in self._groups.items():
            if group.kind is kind and entry.handles:
                self._close_handles(entry.handles)
                entry.handles = []
                n += len(entry.probes)
        return n

    def reattach(self, kind: GroupKind) -> int:
        """Attach again what detach(kind) took off; returns the probes attached."""
        n = 0
        for group, entry in self._groups.items():
            if group.kind is kind and not entry.handles:
                try:
                    entry.handles, attached = self._attach_now(group, entry.probes)
                    entry.probes = tuple(attached)
                    n += len(attached)
                except BpfError as exc:
                    log.warning("re-attaching %s probes of %s failed: %s", kind.value, group.path, exc)
        return n

    @property
    def probe_count(self) -> int:
        """Uprobes plus uretprobes attached so far (those the guardrail has detached for now included)."""
        return sum(len(entry.probes) for entry in self._groups.values())

    def add_target(self, pid: int) -> None:
        """Trace this tgid (only meaningful when compiled with filter_pids)."""
        table = self._bpf["targets"]
        table[ctypes.c_uint32(pid)] = ctypes.c_uint8(1)

    def targets(self) -> set[int]:
        """Tgids currently traced (children added by the fork tracepoint included)."""
        return {k.value for k in self._bpf["targets"].keys()}

    def open_ring(self, callback: Callable[[int, int], None]) -> None:
        """Deliver ring-buffer records as (pointer, size) to `callback`."""

        def _cb(_ctx: object, data: int, size: int) -> int:
            callback(data, size)
            self._polled += 1
            # libbpf consumes for as long as records keep coming: a producer faster than this
            # consumer would hold the agent's loop (guardrail, scans, statistics) in one poll.
            # A negative return ends the poll after this record; the rest wait for the next.
            return -1 if self._polled >= POLL_BATCH else 0

        self._bpf["events"].open_ring_buffer(_cb)

    def poll(self, timeout_ms: int) -> int:
        """Wait up to timeout_ms for records and run the ring callback on each, at most
        POLL_BATCH of them; returns how many."""
        self._polled = 0
        self._bpf.ring_buffer_poll(timeout_ms)
        return self._polled

    def stats(self) -> dict[Stat, int]:
        """The kernel-side counters (drops, overflows, unmatched returns)."""
        table = self._bpf["stats"]
        return {s: int(table[ctypes.c_int(s.value)].value) for s in Stat}

    def pop_frames(self, pid: int, tid: int, depth: int) -> list[CallEvent]:
        """Frames a dead thread left open, as call records (outermost first); frees them."""
        table = self._bpf["inflight"]
        out = []
        for d in range(min(depth, MAX_DEPTH)):
            key = table.Key(tid, d)
            try:
                f = table[key]
            except KeyError:
                continue
            ev = CallEvent(pid=pid, tid=tid, probe_id=f.probe_id, depth=d, call_id=f.call_id,
                           parent_id=f.parent_id, root_id=f.root_id, entry_ns=f.entry_ns,
                           flags=f.flags)
            for i in range(MAX_ARGS):
                ev.args[i] = f.args[i]
            ctypes.memmove(ev.deref, bytes(f.deref), len(bytes(f.deref)))
            out.append(ev)
            try:
                del table[key]
            except KeyError:
                pass
        return out

    def close(self) -> None:
        """Detach everything and free the maps."""
        self._release()
        self._bpf.cleanup()

    def _release(self) -> None:
        self._closer.drain()
        # Releasing a perf uprobe waits in the kernel (~0.1 s each, serialised), a uprobe_multi
        # link once for all its probes: a few hundred perf probes would hold the agent's exit
        # for a minute. A forked child inherits the probe and link fds and releases them after
        # the agent has exited; the agent's own copies close at once, since the child still
        # holds the probes. Until the child is done the probes stay attached, with nobody
        # reading their events.
        links = [h for entry in self._groups.values() for h in entry.handles if isinstance(h, int)]
        probes = self.probe_count
        events = list(self._bpf.uprobe_fds.items())
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
        for name, _ in events:
            self._bpf._del_uprobe_fd(name)  # noqa: SLF001 - closed above
        self._groups.clear()
        log.info("%d probes (%d links, %d perf events) are released by pid %d in the background",
                 probes, len(links), len(events), child)
