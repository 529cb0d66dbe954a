"""Call statistics from the kernel's call_stats entries: series, labels, deltas, bus bandwidth.

The entries are what CallProgram.call_stats() reads from the map (the eBPF tests check the
kernel side against real calls); here each folding rule is checked exactly.
"""

from __future__ import annotations

import dataclasses

import pytest
from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_eacgm.bpf_program import CallStat
from otel_eacgm.events import BW_BUCKETS, DUR_BUCKETS, PY_PROBE_ID, STATUS_UNWOUND
from otel_eacgm.export import ProducingMetricExporter
from otel_eacgm.kernel_names import KernelNames
from otel_eacgm.metrics.call_stats import (BANDWIDTH_BOUNDS, DURATION_BOUNDS_S, OTHER, CallStatistics, bus_factor,
                                           python_key)
from otel_eacgm.perfetto import NullMetricExporter
from otel_eacgm.probes.catalog import CATALOG, torch_spec
from otel_eacgm.spans import error_type

ROWS = dict(enumerate(CATALOG)) | {64: torch_spec("aten::addmm", "")}
SLOT = {spec.symbol: slot for slot, spec in enumerate(CATALOG)}
PID = 42


def entry(symbol: str, count: int, *, status: int = 0, key: int = 0, timed: int = 0, sum_ns: int = 0,
          dur: dict[int, int] | None = None, nbytes: int = 0, bw: dict[int, int] | None = None, bw_sum: int = 0,
          probe_id: int | None = None) -> CallStat:
    d = [0] * DUR_BUCKETS
    for b, n in (dur or {}).items():
        d[b] = n
    w = [0] * BW_BUCKETS
    for b, n in (bw or {}).items():
        w[b] = n
    return CallStat(PID, SLOT[symbol] if probe_id is None else probe_id, status, key, count, timed, sum_ns, nbytes,
                    bw_sum, sum(w), tuple(d), tuple(w))


def stats(names: dict[int, str] | None = None, **kw: object) -> CallStatistics:
    kernels = KernelNames(lambda _pid, addr: (names or {}).get(addr))
    return CallStatistics(ROWS, kernels, error_type, **kw)  # type: ignore[arg-type]


def series(cs: CallStatistics, name: str) -> dict[frozenset, object]:
    out = {}
    for m in cs.metrics():
        if m.name == name:
            for dp in m.data.data_points:
                key = frozenset((k, v) for k, v in dp.attributes.items() if k != "process.pid")
                out[key] = (dp.count, dp.sum, tuple(dp.bucket_counts), tuple(dp.explicit_bounds)) \
                    if hasattr(dp, "bucket_counts") else dp.value
    return out


def by(attr: str, table: dict[frozenset, object]) -> dict[object, object]:
    return {dict(k)[attr]: v for k, v in table.items()}


def test_counts_durations_and_bucket_bounds_come_from_the_entry() -> None:
    cs = stats()
    cs.update([entry("cudaMemcpy", 5, timed=5, sum_ns=12_000, dur={1: 2, 3: 3})])
    assert by("code.function.name", series(cs, "eacgm.calls")) == {"cudaMemcpy": 5}
    (count, total, buckets, bounds), = series(cs, "eacgm.call.duration").values()
    assert (count, total) == (5, pytest.approx(12e-6))
    assert buckets[:4] == (0, 2, 0, 3) and sum(buckets) == 5
    # bucket b holds [2^(b+9), 2^(b+10)) ns: bucket 1 ends at 2048 ns
    assert bounds == DURATION_BOUNDS_S and bounds[1] == pytest.approx(2048e-9) and len(bounds) == DUR_BUCKETS - 1
    labels, = series(cs, "eacgm.calls")
    assert dict(labels)["eacgm.layer"] == "cuda.runtime"


def test_entry_only_calls_have_no_duration_series() -> None:
    cs = stats({0x10: "k"})
    cs.update([entry("cudaLaunchKernel", 3, key=0x10)])
    assert series(cs, "eacgm.call.duration") == {}
    assert by("cuda.kernel.name", series(cs, "eacgm.calls")) == {"k": 3}


def test_series_fold_deltas_so_they_never_decrease() -> None:
    cs = stats()
    cs.update([entry("cudaMemcpy", 4, timed=4, sum_ns=400)])
    cs.update([entry("cudaMemcpy", 10, timed=10, sum_ns=1000)])
    assert by("code.function.name", series(cs, "eacgm.calls")) == {"cudaMemcpy": 10}
    # an unchanged entry adds nothing
    cs.update([entry("cudaMemcpy", 10, timed=10, sum_ns=1000)])
    assert by("code.function.name", series(cs, "eacgm.calls")) == {"cudaMemcpy": 10}


def test_a_driver_handle_named_later_moves_only_later_calls() -> None:
    cs = stats()
    cs.update([entry("cuLaunchKernel", 3, key=0xF00)])
    cs._kernel_names.record(PID, 0xF00, "gemm")  # noqa: SLF001 - a name record arrived
    cs.update([entry("cuLaunchKernel", 8, key=0xF00)])
    assert by("cuda.kernel.name", series(cs, "eacgm.calls")) == {"[unknown]": 3, "gemm": 5}


def test_kernel_names_beyond_the_cap_count_as_other() -> None:
    cs = stats({i: f"k{i}" for i in range(5)}, max_kernel_names=2)
    cs.update([entry("cudaLaunchKernel", 1, key=i) for i in range(5)] + [entry("cudaLaunchKernel", 2, key=99)])
    counts = by("cuda.kernel.name", series(cs, "eacgm.calls"))
    assert counts == {"k0": 1, "k1": 1, OTHER: 3, "[unknown]": 2}


def test_errors_by_type_from_the_status_in_the_key() -> None:
    cs = stats()
    cs.update([entry("cudaMalloc", 4), entry("cudaMalloc", 2, status=2), entry("ncclAllReduce", 3, status=4),
               entry("aten::addmm", 1, status=STATUS_UNWOUND, probe_id=64)])
    errors = {(dict(k)["code.function.name"], dict(k)["error.type"]): v for k, v in series(cs, "eacgm.call.errors").items()}
    assert errors == {("cudaMalloc", "cudaErrorMemoryAllocation"): 2, ("ncclAllReduce", "ncclInvalidArgument"): 3,
                      ("aten::addmm", "eacgm.exception"): 1}
    # calls count every outcome under one series per function
    assert by("code.function.name", series(cs, "eacgm.calls")) == {"cudaMalloc": 6, "ncclAllReduce": 3, "aten::addmm": 1}


def test_incomplete_calls_count_as_errors_without_duration() -> None:
    cs = stats()
    cs.incomplete(PID, ROWS[SLOT["cudaDeviceSynchronize"]], "cudaDeviceSynchronize")
    cs.update([])
    assert by("error.type", series(cs, "eacgm.call.errors")) == {"eacgm.thread_exited": 1}
    assert series(cs, "eacgm.call.duration") == {}


def test_python_keys_take_the_name_learned_from_a_record() -> None:
    cs = stats()
    args = [0x7F0000001000, 0x7F0000002000, 12] + [0] * 7
    cs.learn_python(PID, args, "train.train_step")
    cs.update([entry("", 7, key=python_key(args), timed=7, sum_ns=7000, probe_id=PY_PROBE_ID)])
    labels, = series(cs, "eacgm.calls")
    assert dict(labels) == {"eacgm.layer": "python", "code.function.name": "train.train_step"}


def test_python_key_matches_the_kernel_formula() -> None:
    # py_key in calls.bpf.c: file ^ (func * 0x9E3779B97F4A7C15) ^ (line << 32), modulo 2^64
    assert python_key([1, 1, 0]) == 1 ^ 0x9E3779B97F4A7C15
    assert python_key([0, 0, 0xFFFFFFFF7]) == 0xFFFFFFF7 << 32


def test_bus_bandwidth_uses_the_communicator_size() -> None:
    cs = stats()
    cs.learn_communicator(PID, 0xC0, 8)
    # one 1 GB all-reduce in 10 ms on 8 ranks: algbw 100 GB/s (bucket 17: [2^36, 2^37) B/s)
    cs.update([entry("ncclAllReduce", 1, key=0xC0, timed=1, sum_ns=10_000_000, nbytes=10**9, bw={17: 1},
                     bw_sum=10**11)])
    (count, total, buckets, bounds), = series(cs, "nccl.bus_bandwidth").values()
    assert count == 1 and total == pytest.approx(175e9)  # busbw = algbw x 2*7/8
    assert buckets[17] == 1 and bounds == pytest.approx(tuple(b * 1.75 for b in BANDWIDTH_BOUNDS))
    labels, = series(cs, "nccl.bus_bandwidth")
    assert dict(labels) == {"nccl.collective": "AllReduce", "nccl.nranks": 8}
    assert list(series(cs, "nccl.bytes").values()) == [10**9]


def test_forget_ends_a_process_series() -> None:
    cs = stats()
    cs.update([entry("cudaMemcpy", 1)])
    cs.forget(PID)
    assert cs.metrics() == []


@pytest.mark.parametrize(("collective", "nranks", "factor"), [
    ("AllReduce", 2, 1.0), ("AllReduce", 4, 1.5), ("AllGather", 4, 0.75), ("ReduceScatter", 8, 0.875),
    ("Broadcast", 8, 1.0), ("AllReduce", None, 1.0), ("AllReduce", 1, 1.0),
])
def test_bus_factor(collective: str, nranks: int | None, factor: float) -> None:
    assert bus_factor(collective, nranks) == pytest.approx(factor)


class _Capture(NullMetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object) -> MetricExportResult:  # noqa: ARG002
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS


def test_the_exporter_adds_the_statistics_to_the_agent_resource() -> None:
    cs = stats()
    cs.update([entry("cudaMemcpy", 2)])
    agent = Resource({"service.name": "otel-eacgm-agent"})
    inner = _Capture()
    exporter = ProducingMetricExporter(inner, cs.metrics, agent, InstrumentationScope("calls"))
    sdk_scope = ScopeMetrics(InstrumentationScope("sdk"), [], schema_url="")
    exporter.export(MetricsData([ResourceMetrics(agent, [sdk_scope], schema_url="")]))
    (rm,), = [b.resource_metrics for b in inner.batches]
    assert [s.scope.name for s in rm.scope_metrics] == ["sdk", "calls"]
    assert {m.name for m in rm.scope_metrics[1].metrics} == {"eacgm.calls"}
    # with no SDK batch for the agent's resource, the statistics get one of their own
    exporter.export(MetricsData([]))
    assert inner.batches[-1].resource_metrics[0].resource == agent


def test_each_processes_statistics_go_under_its_own_resource() -> None:
    cs = stats()
    cs.update([entry("cudaMemcpy", 2), dataclasses.replace(entry("cudaMemcpy", 5), pid=PID + 1),
               dataclasses.replace(entry("cudaMalloc", 1), pid=PID + 2)])
    agent = Resource({"service.name": "otel-eacgm-agent"})
    apps = {PID: Resource({"service.name": "train", "process.pid": PID}),
            PID + 1: Resource({"service.name": "infer", "process.pid": PID + 1})}
    known = dict(apps)
    inner = _Capture()
    exporter = ProducingMetricExporter(inner, cs.metrics, agent, InstrumentationScope("calls"), resource_for=known.get)
    exporter.export(MetricsData([ResourceMetrics(agent, [], schema_url="")]))
    counts = {rm.resource.attributes["service.name"]: [(p.attributes["process.pid"], p.value)
                                                      for sm in rm.scope_metrics for m in sm.metrics
                                                      if m.name == "eacgm.calls" for p in m.data.data_points]
              for rm in inner.batches[-1].resource_metrics}
    # PID + 2's resource is not known: its points stay under the agent's
    assert counts == {"train": [(PID, 2)], "infer": [(PID + 1, 5)], "otel-eacgm-agent": [(PID + 2, 1)]}
    del known[PID]  # the process is gone: its points keep the resource last seen
    exporter.export(MetricsData([]))
    assert {rm.resource.attributes["service.name"] for rm in inner.batches[-1].resource_metrics} == \
        {"train", "infer", "otel-eacgm-agent"}
