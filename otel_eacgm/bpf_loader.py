"""The agent's only contact with BCC: compile bpf/calls.bpf.c, attach probes, read maps.

Knobs reach the BPF program as -D flags, never by editing its text. Everything that can fail
in the kernel or in BCC is turned into a typed exception here, so the rest of the agent never
sees BCC's generic ``Exception``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path

from otel_eacgm.events import MAX_ARGS, MAX_DEPTH, PY_RULES, CallEvent, PyRule, Stat
from otel_eacgm.probes.catalog import MAX_SLOTS, ProbeSpec

log = logging.getLogger(__name__)

BPF_DIR = Path(__file__).resolve().parent.parent / "bpf"
_DETACHED_RELEASE_MIN = 8  # probes; fewer are released in the agent (see CallProgram._detach_uprobes)


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


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Run-time knobs of calls.bpf.c: which calls become spans (struct sample_conf)."""

    ratio: float        # share of time slices whose calls are sent as spans
    slow_s: float       # calls at least this long are always sent
    slice_s: float      # one thread's time slice: the unit of sampling
    resample_s: float   # calls entered this long after their parent are decided afresh
    salt: int
    statistics: bool    # aggregate call statistics in the kernel


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
        self._attached: list[tuple[str, str, bool]] = []
        self._entry_only: dict[int, list[str]] = {}  # slot -> libraries with its entry-only probe
        self._attach_offset_fn = None
        try:  # the slot programs tail-call the shared entry/return code
            tails = self._bpf["tails"]
            for index, fn_name in ((0, b"slot_entry"), (1, b"slot_return"), (2, b"unwind"), (3, b"py_entry"),
                                   (4, b"py_return")):
                tails[ctypes.c_int(index)] = ctypes.c_int(self._bpf.load_func(fn_name, bcc.BPF.KPROBE).fd)
        except Exception as exc:  # BCC raises bare Exception when the verifier refuses a program
            raise BpfError(f"loading the shared probe programs of {src} failed: {exc}") from exc

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
            resample_ns=int(sampling.resample_s * 1e9), salt=sampling.salt & (2**64 - 1))

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

    def attach_offset(self, path: str, offset: int, fn_name: str, *, retprobe: bool = False,
                      ref_ctr_offset: int = 0, pid: int = -1, label: str = "") -> None:
        """Attach `fn_name` at a file offset of `path` (a uprobe, or a uretprobe of the function there).

        `ref_ctr_offset` is the file offset of a USDT semaphore (0: none). Raises BpfError.
        """
        fn = self._bpf.load_func(fn_name.encode(), self._bcc.BPF.KPROBE)
        name = path.encode()
        kind = b"r" if retprobe else b"p"
        ev_name = self._bpf._get_uprobe_evname(kind, name, offset, pid)  # noqa: SLF001
        fd = self._offset_attacher()(fn.fd, int(retprobe), ev_name, name, offset, pid, ref_ctr_offset)
        if fd < 0:
            raise BpfError(f"attaching {fn_name} to {label or hex(offset)} at {path}+{offset:#x} failed "
                           f"(ref_ctr_offset {ref_ctr_offset:#x}); see the kernel log (dmesg)")
        self._bpf._add_uprobe_fd(ev_name, fd)  # noqa: SLF001 - so that cleanup() detaches it
        self._attached.append((path, label or hex(offset), False))

    def attach(self, path: str, spec: ProbeSpec, slot: int) -> None:
        """Attach entry_<slot> (and return_<slot>) to `spec.symbol` in the library at `path`.

        Raises SymbolMissing when the library has no such symbol, BpfError otherwise.
        """
        name = path.encode()
        sym = spec.symbol.encode()
        try:
            self._bpf.attach_uprobe(name=name, sym=sym, fn_name=f"entry_{slot}".encode())
            if spec.has_return:
                self._bpf.attach_uretprobe(name=name, sym=sym, fn_name=f"return_{slot}".encode())
        except Exception as exc:
            text = str(exc)
            if "could not determine address of symbol" in text:
                raise SymbolMissing(f"{spec.symbol} not in {path}") from None
            raise BpfError(f"attaching {spec.symbol} in {path} failed: {text}") from exc
        self._attached.append((path, spec.symbol, spec.has_return))
        if not spec.has_return:
            self._entry_only.setdefault(slot, []).append(path)

    def detach_entries(self, slot: int, symbol: str) -> int:
        """Detach an entry-only slot's probes from every library (the guardrail's off phase).
        Entry-only: no return probe can be left waiting for a call entered before. Returns the
        number of probes detached."""
        n = 0
        for path in self._entry_only.get(slot, []):
            try:
                self._bpf.detach_uprobe(name=path.encode(), sym=symbol.encode())
                n += 1
            except Exception as exc:  # BCC raises bare Exception; the probe stays attached
                log.warning("detaching %s in %s failed: %s", symbol, path, exc)
        return n

    def reattach_entries(self, slot: int, symbol: str) -> int:
        """Attach again what detach_entries took off."""
        n = 0
        for path in self._entry_only.get(slot, []):
            try:
                self._bpf.attach_uprobe(name=path.encode(), sym=symbol.encode(), fn_name=f"entry_{slot}".encode())
                n += 1
            except Exception as exc:  # BCC raises bare Exception
                log.warning("re-attaching %s in %s failed: %s", symbol, path, exc)
        return n

    @property
    def probe_count(self) -> int:
        """Uprobes plus uretprobes attached so far."""
        return sum(2 if ret else 1 for _, _, ret in self._attached)

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
            return 0

        self._bpf["events"].open_ring_buffer(_cb)

    def poll(self, timeout_ms: int) -> None:
        """Wait up to timeout_ms for records and run the ring callback on each."""
        self._bpf.ring_buffer_poll(timeout_ms)

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

    def symbolize(self, pid: int, addr: int) -> str | None:
        """Symbol name at `addr` in a live process (mangled names are demangled by BCC)."""
        name = self._bcc.BPF.sym(addr, pid, demangle=False)
        text = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        return None if text.startswith("[unknown]") else text

    def close(self) -> None:
        """Detach everything and free the maps."""
        self._detach_uprobes()
        self._bpf.cleanup()

    def _detach_uprobes(self) -> None:
        # Releasing a uprobe waits in the kernel (~0.1 s each, serialised): the few hundred
        # operator probes would hold the agent's exit for a minute. A forked child inherits the
        # probe fds and releases them after the agent has exited; the agent's own copies close
        # at once, since the child still holds the probes. Until the child is done (about
        # 0.1 s per probe) the probes stay attached, with nobody reading their events.
        events = list(self._bpf.uprobe_fds.items())
        if len(events) < _DETACHED_RELEASE_MIN:
            return
        try:
            child = os.fork()
        except OSError as exc:
            log.warning("releasing %d probes in the agent (fork failed: %s)", len(events), exc)
            return
        if child == 0:  # the releasing child: no Python cleanup, no output, no signal from the terminal
            try:
                os.setsid()
                _set_process_name(RELEASER_NAME)
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
                for _, fd in events:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            finally:
                os._exit(0)
        for name, fd in events:
            try:
                os.close(fd)
            except OSError:
                pass
            self._bpf._del_uprobe_fd(name)  # noqa: SLF001 - closed above
        log.info("%d probes are released by pid %d in the background (about %.0f s)", len(events), child,
                 len(events) * 0.1)
