"""Call statistics: every traced call, counted in the kernel, exported as OTel metrics.

bpf/calls.bpf.c adds each call to the ``call_stats`` map (per process, probe, outcome and key:
the launched kernel or the NCCL communicator): count, a log2 duration histogram, NCCL bytes and
bandwidth. So the statistics cover every call at any span sampling ratio, cost no ring-buffer
record per call, and survive ring-buffer drops. This module turns the map's cumulative entries
into OTLP data points:

* Entries are folded into series by *delta*: what an entry gained since the last read is added
  to the series its labels map to now. A series therefore only grows, even when an entry's
  label changes (a driver kernel handle named after its first launches were counted).
* Label cardinality is bounded: kernel names beyond ``max_kernel_names`` distinct values per
  process fall into one ``other`` series, because a Triton or cuBLAS workload can launch
  thousands of distinct kernels and a metrics backend must not get one series each.
* NCCL bus bandwidth follows nccl-tests' definition (algorithm bandwidth times 2(n-1)/n for
  all-reduce, (n-1)/n for all-gather / reduce-scatter / all-to-all, 1 otherwise) over the host
  call's duration; n comes from the communicator's init call, seen by the agent. NCCL enqueues
  work asynchronously, so for a non-blocking collective this is the enqueue rate, an upper
  bound; it measures the transfer only when the call blocks.

Calls whose thread died before they returned are never completed in the kernel; the agent
reports them with ``incomplete``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from opentelemetry.sdk.metrics.export import (AggregationTemporality, Histogram, HistogramDataPoint, Metric,
                                              NumberDataPoint, Sum)

from otel_eacgm.bpf_program import CallStat
from otel_eacgm.events import BW_BUCKETS, BW_SHIFT, DUR_BUCKETS, DUR_SHIFT, PY_PROBE_ID, STATUS_UNWOUND
from otel_eacgm.kernel_names import UNKNOWN, KernelNames
from otel_eacgm.probes.catalog import Layer, ProbeSpec, Role

OTHER = "other"

#: Upper bounds of the kernel's duration buckets, in seconds: 2^10 ns (1 us) .. 2^40 ns (18 min).
DURATION_BOUNDS_S = tuple(2.0 ** (b + DUR_SHIFT + 1) * 1e-9 for b in range(DUR_BUCKETS - 1))
#: Upper bounds of the kernel's bandwidth buckets, in bytes/s: 2^20 (1 MiB/s) .. 2^50.
BANDWIDTH_BOUNDS = tuple(2.0 ** (b + BW_SHIFT + 1) for b in range(BW_BUCKETS - 1))

_BUS_FACTOR = {
    "AllReduce": lambda n: 2 * (n - 1) / n,
    "AllGather": lambda n: (n - 1) / n,
    "ReduceScatter": lambda n: (n - 1) / n,
    "AlltoAll": lambda n: (n - 1) / n,
    "AllToAll": lambda n: (n - 1) / n,
}
_MASK64 = (1 << 64) - 1


def bus_factor(collective: str, nranks: int | None) -> float:
    """nccl-tests' bus-bandwidth factor; 1 when the communicator size is unknown."""
    factor = _BUS_FACTOR.get(collective)
    return factor(nranks) if factor and nranks and nranks > 1 else 1.0


def python_key(args: Sequence[int]) -> int:
    """The kernel's statistics key of a Python call (py_key in calls.bpf.c)."""
    return (args[0] ^ ((args[1] * 0x9E3779B97F4A7C15) & _MASK64) ^ ((args[2] & 0xFFFFFFFF) << 32)) & _MASK64


@dataclasses.dataclass
class _Totals:
    """One series' cumulative values."""

    start_ns: int
    count: int = 0
    timed: int = 0
    sum_ns: int = 0
    bytes: int = 0
    bw_sum: float = 0.0
    bw_count: int = 0
    dur: list[int] = dataclasses.field(default_factory=lambda: [0] * DUR_BUCKETS)
    bw: list[int] = dataclasses.field(default_factory=lambda: [0] * BW_BUCKETS)


Labels = tuple[tuple[str, object], ...]


class CallStatistics:
    """Folds call_stats map entries into metric series; `metrics()` gives the latest snapshot."""

    def __init__(self, rows: Mapping[int, ProbeSpec], kernel_names: KernelNames,
                 error_type: Callable[[ProbeSpec, int], str], *, max_kernel_names: int = 100) -> None:
        self._rows = rows
        self._kernel_names = kernel_names
        self._error_type = error_type
        self.max_kernel_names = max_kernel_names
        self._bounded: dict[int, set[str]] = {}
        self._python: dict[tuple[int, int], str] = {}       # (pid, key) -> qualified name
        self._nranks: dict[tuple[int, int], int] = {}       # (pid, communicator) -> ranks
        self._last: dict[tuple[int, int, int, int], CallStat] = {}
        self._calls: dict[Labels, _Totals] = {}
        self._errors: dict[Labels, _Totals] = {}
        self._nccl: dict[Labels, _Totals] = {}
        self._lock = threading.Lock()
        self._snapshot: list[Metric] = []

    # --- what the agent learns from the calls it receives ---------------------------------
    def learn_python(self, pid: int, args: Sequence[int], qualified_name: str) -> None:
        """The name of a Python function's statistics key (from any of its call records)."""
        self._python.setdefault((pid, python_key(args)), qualified_name)

    def learn_communicator(self, pid: int, comm: int, nranks: int) -> None:
        """A communicator's size, from its init call (for bus bandwidth)."""
        self._nranks[(pid, comm)] = nranks

    def incomplete(self, pid: int, spec: ProbeSpec | None, name: str) -> None:
        """A call its thread left open: counted as a call and as an error, without a duration."""
        labels = self._base_labels(pid, spec, name)
        self._series(self._calls, labels).count += 1
        self._series(self._errors, labels + (("error.type", "eacgm.thread_exited"),)).count += 1

    # --- folding the kernel's entries -----------------------------------------------------
    def update(self, entries: Sequence[CallStat], scale: Mapping[tuple[int, int], float] | None = None) -> None:
        """Add what each entry gained since the last update, then rebuild the snapshot.
        `scale`: per (pid, probe), the factor extrapolating this window's gains (the
        guardrail's duty-cycled probes counted only while attached)."""
        for e in entries:
            ident = (e.pid, e.probe_id, e.status, e.key)
            before = self._last.get(ident)
            self._last[ident] = e
            if before is not None and before.count == e.count:
                continue
            self._fold(e, before, (scale or {}).get((e.pid, e.probe_id), 1.0))
        self._rebuild()

    def forget(self, pid: int) -> None:
        """Drop the per-process state of an exited process (its series end)."""
        self._bounded.pop(pid, None)
        for table in (self._python, self._nranks):
            for k in [k for k in table if k[0] == pid]:
                del table[k]
        for k in [k for k in self._last if k[0] == pid]:
            del self._last[k]
        for table in (self._calls, self._errors, self._nccl):
            for k in [k for k in table if ("process.pid", pid) in k]:
                del table[k]
        self._rebuild()

    def metrics(self) -> list[Metric]:
        """The latest snapshot (read by the metric export thread)."""
        with self._lock:
            return list(self._snapshot)

    def _fold(self, e: CallStat, before: CallStat | None, factor: float) -> None:
        spec = self._rows.get(e.probe_id)
        if e.probe_id == PY_PROBE_ID:
            name = self._python.get((e.pid, e.key), UNKNOWN)
        elif spec is None:
            return
        else:
            name = spec.symbol
        labels = self._base_labels(e.pid, spec, name)
        if spec is not None and spec.role is Role.LAUNCH:
            labels += (("cuda.kernel.name", self._kernel_label(e.pid, spec, e.key)),)
        d = _delta(e, before)
        if factor != 1.0:
            d = _scaled(d, factor)
        _add(self._series(self._calls, labels), d)
        if e.status:
            error = "eacgm.exception" if e.status == STATUS_UNWOUND or spec is None else self._error_type(spec, e.status)
            self._series(self._errors, labels + (("error.type", error),)).count += d.count
        if spec is not None and spec.count_arg >= 0:
            collective = spec.symbol.removeprefix("nccl")
            nranks = self._nranks.get((e.pid, e.key))
            nccl = (("nccl.collective", collective), ("process.pid", e.pid))
            if nranks:
                nccl += (("nccl.nranks", nranks),)
            t = self._series(self._nccl, nccl)
            t.bytes += d.bytes
            factor = bus_factor(collective, nranks)
            t.bw_sum += d.bw_sum * factor
            t.bw_count += d.bw_count
            t.bw = [a + b for a, b in zip(t.bw, d.bw)]

    def _base_labels(self, pid: int, spec: ProbeSpec | None, name: str) -> Labels:
        layer = spec.layer.value if spec is not None else Layer.PYTHON.value
        return (("eacgm.layer", layer), ("code.function.name", name), ("process.pid", pid))

    def _kernel_label(self, pid: int, spec: ProbeSpec, key: int) -> str:
        by_address = spec.layer is Layer.CUDA_RUNTIME
        name = self._kernel_names.for_address(pid, key) if by_address else self._kernel_names.for_handle(pid, key)
        seen = self._bounded.setdefault(pid, set())
        if name in seen or name == UNKNOWN:
            return name
        if len(seen) < self.max_kernel_names:
            seen.add(name)
            return name
        return OTHER

    @staticmethod
    def _series(table: dict[Labels, _Totals], labels: Labels) -> _Totals:
        t = table.get(labels)
        if t is None:
            t = table[labels] = _Totals(start_ns=time.time_ns())
        return t

    # --- OTLP data points -----------------------------------------------------------------
    def _rebuild(self) -> None:
        now = time.time_ns()
        calls = [_number(labels, t.start_ns, now, t.count) for labels, t in self._calls.items()]
        errors = [_number(labels, t.start_ns, now, t.count) for labels, t in self._errors.items()]
        durations = [HistogramDataPoint(dict(labels), t.start_ns, now, t.timed, t.sum_ns / 1e9, list(t.dur),
                                        DURATION_BOUNDS_S, None, None)  # type: ignore[arg-type]
                     for labels, t in self._calls.items() if t.timed]
        nbytes = [_number(labels, t.start_ns, now, t.bytes) for labels, t in self._nccl.items()]
        bandwidth = []
        for labels, t in self._nccl.items():
            if t.bw_count:
                factor = bus_factor(dict(labels)["nccl.collective"], dict(labels).get("nccl.nranks"))  # type: ignore[arg-type]
                bandwidth.append(HistogramDataPoint(dict(labels), t.start_ns, now, t.bw_count, t.bw_sum, list(t.bw),
                                                    tuple(b * factor for b in BANDWIDTH_BOUNDS), None, None))  # type: ignore[arg-type]
        out = [
            _sum("eacgm.calls", "{call}", "Calls captured, by layer and function", calls),
            _sum("eacgm.call.errors", "{call}", "Calls that failed or never returned, by error.type", errors),
            Metric("eacgm.call.duration", "Duration of calls with a return probe", "s",
                   Histogram(durations, AggregationTemporality.CUMULATIVE)),
            _sum("nccl.bytes", "By", "Bytes handed to NCCL collectives and point-to-point calls", nbytes),
            Metric("nccl.bus_bandwidth", "Bus bandwidth per collective call (nccl-tests definition)", "By/s",
                   Histogram(bandwidth, AggregationTemporality.CUMULATIVE)),
        ]
        with self._lock:
            self._snapshot = [m for m in out if m.data.data_points]


def _delta(e: CallStat, before: CallStat | None) -> CallStat:
    if before is None:
        return e
    return CallStat(e.pid, e.probe_id, e.status, e.key, e.count - before.count, e.timed - before.timed,
                    e.sum_ns - before.sum_ns, e.bytes - before.bytes, e.bw_sum - before.bw_sum,
                    e.bw_count - before.bw_count, tuple(a - b for a, b in zip(e.dur, before.dur)),
                    tuple(a - b for a, b in zip(e.bw, before.bw)))


def _scaled(d: CallStat, f: float) -> CallStat:
    """Gains extrapolated by `f` (integers rounded)."""
    return CallStat(d.pid, d.probe_id, d.status, d.key, round(d.count * f), round(d.timed * f), round(d.sum_ns * f),
                    round(d.bytes * f), round(d.bw_sum * f), round(d.bw_count * f),
                    tuple(round(x * f) for x in d.dur), tuple(round(x * f) for x in d.bw))


def _add(t: _Totals, d: CallStat) -> None:
    t.count += d.count
    t.timed += d.timed
    t.sum_ns += d.sum_ns
    t.dur = [a + b for a, b in zip(t.dur, d.dur)]


def _number(labels: Labels, start_ns: int, now_ns: int, value: int) -> NumberDataPoint:
    return NumberDataPoint(dict(labels), start_ns, now_ns, value)


def _sum(name: str, unit: str, description: str, points: list[NumberDataPoint]) -> Metric:
    return Metric(name, description, unit, Sum(points, AggregationTemporality.CUMULATIVE, is_monotonic=True))
