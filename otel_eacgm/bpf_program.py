"""The agent's only contact with BCC: compile the BPF C, load it, read and write its maps.

Every module that needs BCC goes through this one: the call program (calls.bpf.c), the network
program (metrics/net_bpf.py compiles through `compile_program`), the probe links
(probe_links.py attaches through the primitives of `CallProgram`) and the doctor's checks.
Knobs reach the BPF program as -D flags, never by editing its text. Everything that can fail in the kernel or in BCC becomes a typed exception
here, so the rest of the agent never sees BCC's generic ``Exception``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import logging
import os
import re
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from otel_eacgm import uprobe_multi
from otel_eacgm.bpf import SOURCE_DIR
from otel_eacgm.events import MAX_ARGS, MAX_DEPTH, PY_RULES, CallEvent, PyLayout, PyRule, Stat
from otel_eacgm.probes.catalog import MAX_SLOTS, Layer, ProbeSpec

log = logging.getLogger(__name__)

BPF_DIR = SOURCE_DIR

#: Most ring-buffer records one poll consumes (about 0.02 s of the agent's Python).
POLL_BATCH = 2048
#: A poll that woke for fewer records than this lets more gather for GATHER_S, then takes them:
#: each batch has a fixed cost (numpy views, the loop's tasks), and the ring wakes the agent
#: for every record while it keeps up, so a steady trickle would otherwise pay it per record.
GATHER_BELOW = 256
GATHER_S = 0.02


class BpfError(RuntimeError):
    """The BPF program could not be compiled, loaded or attached."""


class ProcessGone(BpfError):
    """Probes scoped to one process could not be linked because it has exited (a short-lived
    child, such as the `ldconfig -p` that `import torch` runs): nothing of it can be traced."""


class SymbolMissing(BpfError):
    """A catalog symbol is not in this library version (skipped, never fatal)."""


class Tail(enum.IntEnum):
    """calls.bpf.c's eacgm_tail: the common program a probe runs."""

    ENTRY = 0
    RETURN = 1
    PY_ENTRY = 3
    PY_RETURN = 4




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
    hold_forks: bool = False  # stop a target's new child until its scoped probes are linked
    cgroup: tuple[int, int] | None = None  # (id, level) of the traced cgroup v2: new members join at library opens
    ringbuf_pages: int = 1024
    agent_pid: int = dataclasses.field(default_factory=os.getpid)

    @property
    def holds(self) -> bool:
        """Whether the kernel stops processes for the agent (gated opens, held forks)."""
        return self.filter_pids and (self.gate_opens or (self.follow_forks and self.hold_forks))

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
            if self.follow_forks and self.hold_forks:
                flags.append("-DEACGM_HOLD_FORKS")
            if self.cgroup is not None:
                flags += [f"-DEACGM_CGROUP_ID={self.cgroup[0]}ULL", f"-DEACGM_CGROUP_LEVEL={self.cgroup[1]}"]
        return flags




def import_bcc() -> Any:  # noqa: ANN401 - bcc has no type information
    """BCC's Python module, or BpfError saying how to get it."""
    try:
        import bcc  # type: ignore[import-not-found]
    except ImportError as exc:
        raise BpfError(
            f"cannot import bcc ({exc}): install Debian's python3-bpfcc and run the agent with a "
            "Python that sees it (.venv is built with --system-site-packages for this)"
        ) from exc
    return bcc


def u32_map_keys(map_fd: int) -> list[int]:
    """The keys of the BPF hash map `map_fd` keyed by u32, read through its fd alone (the hold
    guard holds that and nothing of the agent's BPF object)."""
    lib = import_bcc().libbcc.lib
    keys: list[int] = []
    key, next_key = ctypes.c_uint32(), ctypes.c_uint32()
    prev = None
    while lib.bpf_get_next_key(map_fd, prev, ctypes.byref(next_key)) == 0:
        keys.append(next_key.value)
        key.value = next_key.value
        prev = ctypes.byref(key)
    return keys


def compile_program(src: Path, cflags: Sequence[str], *, dump: Callable[[str], None] | None = None,
                    hint: str = "Run `otel-eacgm doctor` (kernel headers, root, BPF).") -> Any:  # noqa: ANN401
    """Compile and load the BPF C file `src` (BCC's BPF object); BpfError names the file.
    `dump` gets the program's text first: the file, then every local header it includes."""
    bcc = import_bcc()
    if dump is not None:
        dump(f"// cflags: {' '.join(cflags)}\n" + "\n".join(
            f"// --- {path.relative_to(src.parent)}\n{path.read_text()}" for path in _sources(src)))
    log.debug("compiling %s", src.name)
    try:
        return bcc.BPF(src_file=str(src).encode(), cflags=list(cflags))
    except Exception as exc:  # BCC raises bare Exception for compile and load errors
        raise BpfError(f"loading {src} failed: {exc}. {hint}") from exc


def _sources(src: Path) -> list[Path]:
    """`src` and the local headers it includes (#include "..."), depth first, each once."""
    seen: list[Path] = []

    def visit(path: Path) -> None:
        if path in seen or not path.exists():
            return
        seen.append(path)
        for name in re.findall(r'^\s*#include\s+"([^"]+)"', path.read_text(), re.MULTILINE):
            visit(src.parent / name)

    visit(src)
    return seen


def bcc_location() -> str:
    """Where the bcc module comes from (doctor); BpfError if it cannot be imported."""
    return os.path.dirname(import_bcc().__file__)


def try_libc_uprobe() -> None:
    """Compile a trivial program and attach it to libc's getpid (doctor's end-to-end check)."""
    bcc = import_bcc()
    try:
        prog = bcc.BPF(text=b"int hit(void *ctx) { return 0; }")
        prog.attach_uprobe(name=b"c", sym=b"getpid", fn_name=b"hit")
        prog.cleanup()
    except Exception as exc:  # BCC raises bare Exception
        raise BpfError(f"compiling/attaching a uprobe failed: {exc}") from exc


def uprobe_multi_usable() -> bool:
    """Whether this kernel takes uprobe_multi links (6.6+); BpfError if the test program fails to load."""
    bcc = import_bcc()
    try:
        prog = bcc.BPF(text=b"int hit(void *ctx) { return 0; }")
        try:
            return uprobe_multi.supported(prog.load_func(b"hit", bcc.BPF.KPROBE, None,
                                                         uprobe_multi.BPF_TRACE_UPROBE_MULTI).fd)
        finally:
            prog.cleanup()
    except Exception as exc:  # BCC raises bare Exception
        raise BpfError(f"loading a uprobe_multi program failed: {exc}") from exc


class CallProgram:
    """calls.bpf.c loaded into the kernel: its maps, its ring buffer, and the primitives that
    attach its programs to a file offset (the probe links decide what goes where)."""

    def __init__(self, options: ProgramOptions, *, dump: Callable[[str], None] | None = None) -> None:
        self._bcc = bcc = import_bcc()
        self.options = options
        src = BPF_DIR / "calls.bpf.c"
        self._bpf = compile_program(src, options.cflags(), dump=dump)
        self._batch: list[bytes] = []
        self._on_batch: Callable[[list[bytes]], None] = lambda _records: None
        self._attach_offset_fn = None
        self._gaps: dict[str, bool] = {}  # who holds cycle_gap open -> whether for every probe
        self.multi_prog_fd = -1
        """The program uprobe_multi links attach (-1: this kernel has none; one perf event per probe)."""
        attach_type = -1
        if options.uprobe_multi:
            try:  # loaded first: the programs it tail-calls must be loaded with its attach type
                fd = self._bpf.load_func(b"multi_probe", bcc.BPF.KPROBE, None, uprobe_multi.BPF_TRACE_UPROBE_MULTI).fd
                if uprobe_multi.supported(fd):
                    self.multi_prog_fd, attach_type = fd, uprobe_multi.BPF_TRACE_UPROBE_MULTI
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

    def configure(self, slot: int, spec: ProbeSpec) -> None:
        """Write a probe row's settings into probe_conf[slot]."""
        table = self._bpf["probe_conf"]
        table[ctypes.c_int(slot)] = table.Leaf(has_return=int(spec.has_return), exit_probes=int(spec.exit_probes),
                                                    returns_status=int(spec.returns_status),
                                                    always_send=int(spec.always_send),
                                                    deref_arg=spec.deref_arg, out_arg=spec.out_arg,
                                                    str_arg=spec.str_arg, key_arg=spec.key_arg,
                                                    count_arg=spec.count_arg, dtype_arg=spec.dtype_arg,
                                                    cyclable=int(spec.layer is Layer.TORCH or spec.cyclable))

    def set_cycle_gap(self, holder: str, on: bool, *, every_probe: bool = False) -> None:
        """Whether `holder` (the guardrail, operator shedding: cyclable entries; the pause cycle:
        every entry, `every_probe`) has entries detached while their returns may fire: their
        returns without a frame count as cycled_returns, not unmatched_returns. The gap lasts
        while any holder holds it."""
        if on:
            self._gaps[holder] = every_probe
        else:
            self._gaps.pop(holder, None)
        value = 2 if any(self._gaps.values()) else int(bool(self._gaps))
        self._bpf["cycle_gap"][ctypes.c_int(0)] = ctypes.c_uint32(value)

    def configure_python(self, usdt_regs: tuple[int, int, int]) -> None:
        """Where py_entry/py_return find function__entry's arguments (pt_regs byte offsets)."""
        table = self._bpf["py_conf"]
        leaf = table.Leaf(has_return=1, deref_arg=-1, out_arg=-1, str_arg=-1, key_arg=-1, count_arg=-1, dtype_arg=-1)
        for i, off in enumerate(usdt_regs):
            leaf.usdt_reg[i] = off
        table[ctypes.c_int(0)] = leaf

    def set_python_layout(self, pid: int, layout: PyLayout) -> None:
        """Walk the Python frames of `pid`'s outermost traced calls with this interpreter layout."""
        table = self._bpf["py_layouts"]
        leaf = table.Leaf()
        ctypes.memmove(ctypes.addressof(leaf), ctypes.addressof(layout), ctypes.sizeof(PyLayout))
        table[ctypes.c_uint32(pid)] = leaf

    def forget_python_layout(self, pid: int) -> None:
        """Stop walking `pid`'s frames (it exited or executed another program)."""
        try:
            del self._bpf["py_layouts"][ctypes.c_uint32(pid)]
        except KeyError:
            pass

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
            lib = self._bcc.libbcc.lib
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

    def attach_perf_uprobe(self, tail: Tail, slot: int, path: str, offset: int, *, pid: int, retprobe: bool,
                           ref_ctr_offset: int) -> str:
        """Attach the program of `tail` (and `slot`) at path+offset as one perf-event uprobe;
        returns its event name (the handle detach_perf_uprobe takes)."""
        fn_name = {Tail.ENTRY: f"entry_{slot}", Tail.RETURN: f"return_{slot}",
                   Tail.PY_ENTRY: "py_entry", Tail.PY_RETURN: "py_return"}[tail]
        fn = self._bpf.load_func(fn_name.encode(), self._bcc.BPF.KPROBE)
        name = path.encode()
        ev_name = self._bpf._get_uprobe_evname(b"r" if retprobe else b"p", name, offset, pid)  # noqa: SLF001
        fd = self._offset_attacher()(fn.fd, int(retprobe), ev_name, name, offset, pid, ref_ctr_offset)
        if fd < 0:
            raise BpfError(f"attaching {fn_name} at {path}+{offset:#x} failed "
                           f"(ref_ctr_offset {ref_ctr_offset:#x}); see the kernel log (dmesg)")
        self._bpf._add_uprobe_fd(ev_name, fd)  # noqa: SLF001 - so that cleanup() detaches it
        return ev_name.decode()

    def detach_perf_uprobe(self, name: str) -> None:
        """Detach one perf-event uprobe (its event name)."""
        try:
            self._bpf.detach_uprobe_event(name.encode())
        except Exception as exc:  # BCC raises bare Exception; the probe stays attached
            raise BpfError(f"detaching {name} failed: {exc}") from exc

    def perf_uprobe_fds(self) -> list[tuple[bytes, int]]:
        """(event name, fd) of every perf-event uprobe attached."""
        return list(self._bpf.uprobe_fds.items())

    def disown_perf_uprobes(self, names: Sequence[bytes]) -> None:
        """Forget perf-event uprobes whose fds were closed elsewhere (a releasing child holds them)."""
        for name in names:
            self._bpf._del_uprobe_fd(name)  # noqa: SLF001

    def stop_holding(self) -> None:
        """Stop no process any more (gated opens, held forks): the agent is ending, and a process
        stopped after its last poll would wait for a SIGCONT that never comes."""
        self._bpf["holds_off"][ctypes.c_int(0)] = ctypes.c_uint32(1)

    def let_go(self, pid: int) -> None:
        """Continue a process stopped for the agent (a gated open, a held fork) and strike it off
        the kernel's list of held processes, which the hold guard reads if the agent dies."""
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        try:
            del self._bpf["held"][ctypes.c_uint32(pid)]
        except KeyError:
            pass

    @property
    def held_map_fd(self) -> int:
        """The fd of the kernel's list of held processes (the hold guard's copy keeps it readable)."""
        return self._bpf["held"].map_fd

    def add_target(self, pid: int) -> None:
        """Trace this tgid (only meaningful when compiled with filter_pids)."""
        table = self._bpf["targets"]
        table[ctypes.c_uint32(pid)] = ctypes.c_uint8(1)

    def remove_target(self, pid: int) -> None:
        """Stop tracing this tgid (the kernel removes a target itself when it exits)."""
        try:
            del self._bpf["targets"][ctypes.c_uint32(pid)]
        except KeyError:
            pass

    def targets(self) -> set[int]:
        """Tgids currently traced (children added by the fork tracepoint included)."""
        return {k.value for k in self._bpf["targets"].keys()}

    def open_ring(self, on_batch: Callable[[list[bytes]], None]) -> None:
        """Deliver ring-buffer records to `on_batch`, each poll's records as one list of bytes.

        The per-record callback only copies the record out (the ring's memory is reused once
        it returns); decoding and everything after happen once per batch (pipeline.py).
        """
        batch: list[bytes] = []
        self._batch = batch
        self._on_batch = on_batch
        append, copy = batch.append, ctypes.string_at

        def _cb(_ctx: object, data: int, size: int) -> int:
            append(copy(data, size))
            # libbpf consumes for as long as records keep coming: a producer faster than this
            # consumer would hold the agent's loop (guardrail, scans, statistics) in one poll.
            # A negative return ends the poll after this record; the rest wait for the next.
            return -1 if len(batch) >= POLL_BATCH else 0

        self._bpf["events"].open_ring_buffer(_cb)

    def poll(self, timeout_ms: int) -> int:
        """Wait up to timeout_ms for records, at most POLL_BATCH of them, and hand them to the
        batch callback; returns how many."""
        self._bpf.ring_buffer_poll(timeout_ms)
        batch = self._batch
        if not batch:
            return 0
        if len(batch) < GATHER_BELOW:
            time.sleep(GATHER_S)
            self._bpf.ring_buffer_consume()
        records = batch[:]
        batch.clear()
        self._on_batch(records)
        return len(records)

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
        """Free the maps and programs (release the probe links first)."""
        self._bpf.cleanup()
