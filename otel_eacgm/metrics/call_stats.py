"""Call statistics: every captured call feeds counters and histograms, sampled spans or not.

The statistics are built from the span of each call record in the agent's process (the kernel
hands every call over through the ring buffer, so nothing is sampled before this point). Label
cardinality is bounded: kernel names beyond ``max_kernel_names`` distinct values per process
fall into one ``other`` series, because a Triton or cuBLAS workload can launch thousands of
distinct kernels and a metrics backend must not get one series each.

NCCL bus bandwidth follows nccl-tests' definition (algorithm bandwidth times 2(n-1)/n for
all-reduce, (n-1)/n for all-gather / reduce-scatter / all-to-all, 1 otherwise) over the host
call's duration. NCCL enqueues work asynchronously, so for a non-blocking collective this is
the enqueue rate, an upper bound; it measures the transfer only when the call blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.metrics import Meter
from opentelemetry.sdk.trace import ReadableSpan

OTHER = "other"

#: Histogram bucket bounds in seconds: 1 us .. 10 s, about three buckets a decade.
DURATION_BOUNDS_S = (1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3,
                     1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
#: Bandwidth bucket bounds in bytes/s: 1 MB/s .. 1 TB/s.
BANDWIDTH_BOUNDS = tuple(float(m * 10 ** e) for e in range(6, 13) for m in (1, 2, 5))

_BUS_FACTOR = {
    "AllReduce": lambda n: 2 * (n - 1) / n,
    "AllGather": lambda n: (n - 1) / n,
    "ReduceScatter": lambda n: (n - 1) / n,
    "AlltoAll": lambda n: (n - 1) / n,
    "AllToAll": lambda n: (n - 1) / n,
}


def bus_factor(collective: str, nranks: int | None) -> float:
    """nccl-tests' bus-bandwidth factor; 1 when the communicator size is unknown."""
    factor = _BUS_FACTOR.get(collective)
    return factor(nranks) if factor and nranks and nranks > 1 else 1.0


class CallStatistics:
    """Records one call at a time into OTel instruments (the SDK aggregates them)."""

    def __init__(self, meter: Meter, *, max_kernel_names: int = 100) -> None:
        self.max_kernel_names = max_kernel_names
        self._kernel_names: dict[int, set[str]] = {}
        self._nranks: dict[str, int] = {}
        self._calls = meter.create_counter(
            "eacgm.calls", unit="{call}", description="Calls captured, by layer and function")
        self._errors = meter.create_counter(
            "eacgm.call.errors", unit="{call}", description="Calls that failed or never returned, by error.type")
        self._duration = meter.create_histogram(
            "eacgm.call.duration", unit="s", description="Duration of calls with a return probe",
            explicit_bucket_boundaries_advisory=DURATION_BOUNDS_S)
        self._nccl_bytes = meter.create_counter(
            "nccl.bytes", unit="By", description="Bytes handed to NCCL collectives and point-to-point calls")
        self._bus_bw = meter.create_histogram(
            "nccl.bus_bandwidth", unit="By/s", description="Bus bandwidth per collective call (nccl-tests definition)",
            explicit_bucket_boundaries_advisory=BANDWIDTH_BOUNDS)

    def record(self, span: ReadableSpan) -> None:
        """Count the call of `span` (a span built by spans.SpanBuilder)."""
        a: Mapping[str, Any] = span.attributes or {}
        pid = a.get("process.pid", 0)
        labels: dict[str, Any] = {"eacgm.layer": a.get("eacgm.layer", ""), "code.function.name": span.name,
                                  "process.pid": pid}
        kernel = a.get("cuda.kernel.name")
        if kernel is not None:
            labels["cuda.kernel.name"] = self._bounded_kernel(pid, kernel)
        self._calls.add(1, labels)
        if "error.type" in a:
            self._errors.add(1, labels | {"error.type": a["error.type"]})
        comm = a.get("nccl.comm")
        if "nccl.nranks" in a and comm:
            self._nranks[comm] = a["nccl.nranks"]
        returned = "eacgm.call.return_code" in a
        timed = returned and span.start_time is not None and span.end_time is not None
        seconds = (span.end_time - span.start_time) / 1e9 if timed else None
        if seconds is not None:
            self._duration.record(seconds, labels)
        nbytes = a.get("nccl.bytes")
        if nbytes is not None:
            collective = a.get("nccl.collective", span.name)
            nccl_labels = {"nccl.collective": collective, "process.pid": pid}
            self._nccl_bytes.add(nbytes, nccl_labels)
            if seconds and seconds > 0 and a.get("eacgm.call.return_code") == 0:
                self._bus_bw.record(nbytes / seconds * bus_factor(collective, self._nranks.get(comm)), nccl_labels)

    def _bounded_kernel(self, pid: int, name: str) -> str:
        seen = self._kernel_names.setdefault(pid, set())
        if name in seen:
            return name
        if len(seen) < self.max_kernel_names:
            seen.add(name)
            return name
        return OTHER

    def forget(self, pid: int) -> None:
        """Drop the per-process state of an exited process."""
        self._kernel_names.pop(pid, None)
