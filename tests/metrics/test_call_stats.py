"""Call statistics from spans: bounded kernel-name labels and NCCL bus bandwidth."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from metrics_readback import provider
from otel_eacgm.metrics.call_stats import OTHER, CallStatistics, bus_factor


def span(name: str, start_ns: int, end_ns: int, **attrs: object) -> ReadableSpan:
    base = {"eacgm.layer": "nccl" if name.startswith("nccl") else "cuda.driver", "process.pid": 42}
    return ReadableSpan(name=name, start_time=start_ns, end_time=end_ns, attributes=base | attrs)


def series(reader, name: str) -> dict[frozenset, object]:  # noqa: ANN001
    out = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    for dp in m.data.data_points:
                        key = frozenset(dp.attributes.items())
                        out[key] = (dp.count, dp.sum) if hasattr(dp, "count") else dp.value
    return out


def test_kernel_names_beyond_the_cap_count_as_other() -> None:
    mp, reader = provider()
    stats = CallStatistics(mp.get_meter("t"), max_kernel_names=2)
    for i in range(5):
        stats.record(span("cuLaunchKernel", 0, 0, **{"cuda.kernel.name": f"k{i}"}))
    stats.record(span("cuLaunchKernel", 0, 0, **{"cuda.kernel.name": "k0"}))
    counts = {dict(k)["cuda.kernel.name"]: v for k, v in series(reader, "eacgm.calls").items()}
    assert counts == {"k0": 2, "k1": 1, OTHER: 3}
    assert series(reader, "eacgm.call.duration") == {}  # entry-only launches have no duration


def test_bus_bandwidth_uses_the_communicator_size() -> None:
    mp, reader = provider()
    stats = CallStatistics(mp.get_meter("t"))
    stats.record(span("ncclCommInitRank", 0, 1000, **{"nccl.nranks": 8, "nccl.rank": 0, "nccl.comm": "0xc0",
                                                        "eacgm.call.return_code": 0}))
    # 1 GB all-reduce in 10 ms on 8 ranks: algbw 100 GB/s, busbw x 2*7/8 = 175 GB/s
    stats.record(span("ncclAllReduce", 0, 10_000_000, **{"nccl.collective": "AllReduce", "nccl.bytes": 10**9,
                                                         "nccl.comm": "0xc0", "eacgm.call.return_code": 0}))
    (count, total), = series(reader, "nccl.bus_bandwidth").values()
    assert count == 1 and total == pytest.approx(175e9)
    assert list(series(reader, "nccl.bytes").values()) == [10**9]
    (dcount, dsum), = [v for k, v in series(reader, "eacgm.call.duration").items()
                       if dict(k)["code.function.name"] == "ncclAllReduce"]
    assert dcount == 1 and dsum == pytest.approx(0.01)


@pytest.mark.parametrize(("collective", "nranks", "factor"), [
    ("AllReduce", 2, 1.0), ("AllReduce", 4, 1.5), ("AllGather", 4, 0.75), ("ReduceScatter", 8, 0.875),
    ("Broadcast", 8, 1.0), ("AllReduce", None, 1.0), ("AllReduce", 1, 1.0),
])
def test_bus_factor(collective: str, nranks: int | None, factor: float) -> None:
    assert bus_factor(collective, nranks) == pytest.approx(factor)
