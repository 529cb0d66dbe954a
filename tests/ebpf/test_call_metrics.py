"""Call statistics and host metrics leave the agent over OTLP next to the spans.

Real uprobes on the wheels' libcudart/libnccl, the real Collector, and counts that must equal
what the workload did: every call is counted, whatever happens to its span.
"""

from __future__ import annotations

import collections

import pytest

from agent_run import run_traced, summary

pytestmark = pytest.mark.ebpf

PLAN = [["cudaMalloc", 4], ["cudaDeviceSynchronize", 6], ["cudaLaunchKernel", 9], ["ncclAllReduce", 3],
        ["ncclSend", 2], ["ncclGroupStart", 1], ["ncclGroupEnd", 1]]


def latest(points: list[dict], name: str, pid: int) -> dict[tuple, object]:
    """The last (cumulative) value of each series of `name` for `pid`, keyed by its sorted attributes."""
    out: dict[tuple, tuple[int, object]] = {}
    for p in points:
        if p["name"] == name and p["attributes"].get("process.pid") == pid:
            key = tuple(sorted((k, v) for k, v in p["attributes"].items() if k != "process.pid"))
            if key not in out or p["time"] >= out[key][0]:
                out[key] = (p["time"], p["value"])
    return {k: v for k, (_, v) in out.items()}


@pytest.fixture(scope="module")
def metered_run(pipeline):  # noqa: ANN001, ANN201
    """One traced run; the metric points the store received for its process."""
    proc, calls = run_traced(pipeline.grpc_endpoint, PLAN, "--launch-layer", "cuda.runtime",
                             env={"OTEL_EACGM_METRICS_INTERVAL_S": "1", "OTEL_RESOURCE_ATTRIBUTES": "team=ml%20infra"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    pid = calls[0]["tid"]
    total = sum(n for _, n in PLAN)

    def counted() -> int:
        return sum(latest(pipeline.store.metric_points(), "eacgm.calls", pid).values())

    assert pipeline.store.wait_for(lambda: counted() >= total, 30), counted()
    return proc, calls, pid, pipeline.store.metric_points()


def test_call_counts_equal_the_calls_made(metered_run) -> None:  # noqa: ANN001
    proc, calls, pid, points = metered_run
    made = collections.Counter(c["fn"] for c in calls)
    counted = collections.Counter()
    for key, value in latest(points, "eacgm.calls", pid).items():
        attrs = dict(key)
        counted[attrs["code.function.name"]] += value
        assert attrs["eacgm.layer"] == ("nccl" if attrs["code.function.name"].startswith("nccl") else "cuda.runtime")
    assert counted == made
    assert summary(proc.stderr)["calls"] == sum(made.values())


def test_duration_histograms_count_every_returning_call(metered_run) -> None:  # noqa: ANN001
    _, calls, pid, points = metered_run
    made = collections.Counter(c["fn"] for c in calls)
    hist = {dict(k)["code.function.name"]: v for k, v in latest(points, "eacgm.call.duration", pid).items()}
    # launches are entry-only probes: counted, but without a duration
    assert set(hist) == set(made) - {"cudaLaunchKernel"}
    for fn, value in hist.items():
        assert value["count"] == made[fn], fn
        assert 0 < value["sum"] < made[fn] * 0.5, (fn, value)


def test_errors_by_type(metered_run) -> None:  # noqa: ANN001
    _, _, pid, points = metered_run
    errors = {(dict(k)["code.function.name"], dict(k)["error.type"]): v
              for k, v in latest(points, "eacgm.call.errors", pid).items()}
    assert errors == {("cudaMalloc", "cudaErrorInsufficientDriver"): 4,
                      ("cudaDeviceSynchronize", "cudaErrorInsufficientDriver"): 6,
                      ("ncclAllReduce", "ncclInvalidArgument"): 3, ("ncclSend", "ncclInvalidArgument"): 2}


def test_nccl_bytes_per_collective(metered_run) -> None:  # noqa: ANN001
    _, _, pid, points = metered_run
    by = {dict(k)["nccl.collective"]: v for k, v in latest(points, "nccl.bytes", pid).items()}
    assert by == {"AllReduce": 3 * 4000, "Send": 2 * 512}
    # failed calls moved nothing: no bandwidth sample from them
    assert latest(points, "nccl.bus_bandwidth", pid) == {}


def test_kernel_names_label_launch_counts(metered_run) -> None:  # noqa: ANN001
    _, _, pid, points = metered_run
    launches = {k: v for k, v in latest(points, "eacgm.calls", pid).items()
                if dict(k)["code.function.name"] == "cudaLaunchKernel"}
    assert [dict(k).get("cuda.kernel.name") for k in launches] == ["cudaGetErrorName"]
    assert sum(launches.values()) == 9


def test_host_network_metrics_arrive_from_the_agent(metered_run) -> None:  # noqa: ANN001
    *_, points = metered_run
    lo = [p for p in points if p["name"] == "system.network.io" and p["attributes"].get("network.interface.name") == "lo"]
    assert lo, sorted({p["name"] for p in points})
    assert lo[0]["resource"]["service.name"] == "otel-eacgm-agent"
    # the agent's own OTEL_RESOURCE_ATTRIBUTES (the session's store also holds other tests' agents)
    assert any(p["resource"].get("team") == "ml infra" for p in lo), [p["resource"] for p in lo][:3]


def test_call_metrics_carry_the_traced_processes_resource(metered_run) -> None:  # noqa: ANN001
    _, _, pid, points = metered_run
    calls = [p for p in points if p["name"] in ("eacgm.calls", "eacgm.call.duration")
             and p["attributes"].get("process.pid") == pid]
    assert calls
    for p in calls:
        res = p["resource"]
        # the workload's script names its service (python cuda_nccl_calls.py), its variable adds to it
        assert (res["service.name"], res["process.pid"], res["team"]) == ("cuda_nccl_calls", pid, "ml infra"), res



def test_the_agent_reports_its_own_cpu_time(metered_run) -> None:  # noqa: ANN001
    *_, points = metered_run
    cpu = {p["attributes"]["cpu.mode"]: p["value"] for p in points if p["name"] == "process.cpu.time"
           and p["resource"]["service.name"] == "otel-eacgm-agent"}
    assert set(cpu) == {"user", "system"} and cpu["user"] > 0.1, cpu  # BCC's compile alone costs more


QUIET_PLAN = [["cudaLaunchKernel", 300], ["ncclGroupStart", 50], ["ncclGroupEnd", 50], ["cudaMalloc", 3]]


def test_statistics_count_every_call_while_the_kernel_sends_only_what_sampling_keeps(pipeline) -> None:  # noqa: ANN001
    """At sampling ratio 0 the kernel sends only failed, slow and decoder-state calls, and still
    counts every call: the statistics are aggregated in the kernel, not from records."""
    proc, calls = run_traced(pipeline.grpc_endpoint, QUIET_PLAN, "--launch-layer", "cuda.runtime",
                             env={"OTEL_EACGM_METRICS_INTERVAL_S": "1", "OTEL_EACGM_SPAN_SAMPLE_RATIO": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    pid = calls[0]["tid"]
    made = collections.Counter(c["fn"] for c in calls)

    def counted() -> collections.Counter:
        out: collections.Counter = collections.Counter()
        for key, value in latest(pipeline.store.metric_points(), "eacgm.calls", pid).items():
            out[dict(key)["code.function.name"]] += value
        return out

    assert pipeline.store.wait_for(lambda: counted() == made, 30), (counted(), made)
    durations = {dict(k)["code.function.name"]: v["count"]
                 for k, v in latest(pipeline.store.metric_points(), "eacgm.call.duration", pid).items()}
    assert durations == {"ncclGroupStart": 50, "ncclGroupEnd": 50, "cudaMalloc": 3}
    spans = [s for s in pipeline.store.spans() if s["attributes"].get("process.pid") == pid]
    # cudaMalloc failed (and feeds the allocation-size decoder): sent; the rest stayed in the kernel
    assert collections.Counter(s["name"] for s in spans) == {"cudaMalloc": 3}
    report = summary(proc.stderr)
    assert (report["calls"], report["received"], report["sampled_out"]) == (403, 3, 400)
