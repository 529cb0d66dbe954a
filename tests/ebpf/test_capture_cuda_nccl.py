"""Real uprobes on the wheels' libcudart and libnccl, real Collector, exact spans.

The workload calls the libraries through ctypes; without a GPU they fail with real error codes
(cudaErrorInsufficientDriver, ncclInvalidArgument), which the spans must report.
"""

from __future__ import annotations

import collections

import pytest

from agent_run import run_traced, summary

pytestmark = pytest.mark.ebpf

PLAN = [
    ["cudaMalloc", 3], ["cudaFree", 2], ["cudaMemcpy", 2], ["cudaMemcpyAsync", 1], ["cudaMemset", 1],
    ["cudaDeviceSynchronize", 4], ["cudaStreamSynchronize", 1], ["cudaSetDevice", 1],
    ["cudaLaunchKernel", 5], ["__cudaGetKernel", 2], ["ncclAllReduce", 3], ["ncclReduce", 2], ["ncclSend", 1],
    ["ncclGroupStart", 2], ["ncclGroupEnd", 2],
]


@pytest.fixture(scope="module")
def traced_run(pipeline):  # noqa: ANN001, ANN201
    """One traced workload run; its spans as the store received them."""
    proc, calls = run_traced(pipeline.grpc_endpoint, PLAN, "--launch-layer", "cuda.runtime",
                             env={"OTEL_SERVICE_NAME": "ctypes-workload", "RANK": "3", "WORLD_SIZE": "8"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    pid = calls[0]["tid"]
    expected = sum(n for _, n in PLAN)
    assert pipeline.store.wait_for(lambda: len([s for s in pipeline.store.spans() if s["attributes"].get("process.pid") == pid]) >= expected, 30)
    spans = [s for s in pipeline.store.spans() if s["attributes"].get("process.pid") == pid]
    return proc, calls, spans


def test_every_call_is_one_span(traced_run) -> None:  # noqa: ANN001
    proc, calls, spans = traced_run
    assert collections.Counter(s["name"] for s in spans) == collections.Counter(c["fn"] for c in calls)
    assert len(calls) == sum(n for _, n in PLAN)
    counters = summary(proc.stderr)
    assert counters["calls"] == counters["exported"] == len(calls)
    assert counters["dropped_export"] == counters["dropped_ringbuf"] == 0


def test_spans_carry_real_error_codes(traced_run) -> None:  # noqa: ANN001
    _, calls, spans = traced_run
    rc = {c["fn"]: c["rc"] for c in calls}
    assert rc["cudaMalloc"] == 35 and rc["ncclAllReduce"] == 4  # the libraries' own answers
    for s in spans:
        if s["name"] in ("ncclGroupStart", "ncclGroupEnd"):
            assert s["status_code"] == 0 and s["attributes"]["eacgm.call.return_code"] == 0
        elif s["name"] == "cudaLaunchKernel":  # entry-only probe: no return seen
            assert "eacgm.call.return_code" not in s["attributes"]
        elif s["name"].startswith(("cuda", "__cuda")):
            assert s["status_code"] == 2, s  # STATUS_CODE_ERROR
            assert s["attributes"]["error.type"] == "cudaErrorInsufficientDriver"
            assert s["attributes"]["eacgm.call.return_code"] == rc[s["name"]]
        else:
            assert s["attributes"]["error.type"] == "ncclInvalidArgument"


def test_decoded_arguments(traced_run) -> None:  # noqa: ANN001
    _, _, spans = traced_run
    by = collections.defaultdict(list)
    for s in spans:
        by[s["name"]].append(s["attributes"])
    launch = by["cudaLaunchKernel"][0]
    assert launch["cuda.grid"] == [2, 3, 4] and launch["cuda.block"] == [32, 1, 1]
    assert launch["cuda.shared_mem.bytes"] == 48 and launch["cuda.stream"] == "0x55"
    # the workload launches cudaGetErrorName's address: the ELF symbol names the "kernel"
    assert launch["cuda.kernel.name"] == "cudaGetErrorName"
    # the runtime layer's name record: without a driver it fails, so no handle is named, but
    # the span names the stub it was asked for
    assert [a["cuda.kernel.name"] for a in by["__cudaGetKernel"]] == ["cudaGetErrorName"] * 2
    assert by["cudaMalloc"][0]["cuda.memory.bytes"] == 1 << 20
    assert by["cudaMemcpy"][0]["cuda.memory.bytes"] == 4096 and by["cudaMemcpy"][0]["cuda.memcpy.kind"] == "HostToDevice"
    assert by["cudaMemcpyAsync"][0]["cuda.memcpy.kind"] == "DeviceToHost" and by["cudaMemcpyAsync"][0]["cuda.stream"] == "0x55"
    assert by["cudaSetDevice"][0]["cuda.device.id"] == 3
    ar = by["ncclAllReduce"][0]
    assert (ar["nccl.collective"], ar["nccl.count"], ar["nccl.datatype"], ar["nccl.bytes"], ar["nccl.reduce_op"]) == \
        ("AllReduce", 1000, "float32", 4000, "sum")
    assert ar["cuda.stream"] == "0x66" and ar["nccl.comm"] == "0x0"
    red = by["ncclReduce"][0]  # 8 arguments: comm and stream come from the stack
    assert (red["nccl.datatype"], red["nccl.bytes"], red["nccl.reduce_op"], red["nccl.root"], red["cuda.stream"]) == \
        ("bfloat16", 512, "max", 1, "0x77")
    send = by["ncclSend"][0]
    assert (send["nccl.count"], send["nccl.datatype"], send["nccl.bytes"], send["nccl.peer"]) == (64, "int64", 512, 5)
    for s in spans:
        assert s["attributes"]["eacgm.layer"] == ("nccl" if s["name"].startswith("nccl") else "cuda.runtime")
        assert s["attributes"]["code.function.name"] == s["name"]


def test_timestamps_are_inside_the_callers_bracket(traced_run) -> None:  # noqa: ANN001
    _, calls, spans = traced_run
    ordered = sorted(spans, key=lambda s: s["start"])
    assert [s["name"] for s in ordered] == [c["fn"] for c in calls]
    slack = 2_000_000  # 2 ms: clock offset measurement and scheduling
    for s, c in zip(ordered, calls):
        assert c["t0"] - slack <= s["start"] <= s["end"] <= c["t1"] + slack, (s["name"], s["start"] - c["t0"], c["t1"] - s["end"])
        assert s["attributes"]["thread.id"] == c["tid"]


def test_resource_of_the_traced_process(traced_run) -> None:  # noqa: ANN001
    _, calls, spans = traced_run
    res = spans[0]["resource"]
    assert res["service.name"] == "ctypes-workload"
    assert res["process.pid"] == calls[0]["tid"]
    assert res["process.executable.name"].startswith("python")
    assert res["eacgm.rank"] == 3 and res["eacgm.world_size"] == 8
    assert "host.name" in res


def test_top_level_calls_have_no_parent_and_share_a_trace_per_time_slice(traced_run) -> None:  # noqa: ANN001
    # outermost calls with nothing under them: one trace per thread and 1 s slice (trace_slice_s)
    _, _, spans = traced_run
    assert all(s["parent_span_id"] == "" for s in spans)
    slices = {(s["attributes"]["thread.id"], s["start"] // 10**9) for s in spans}
    by_slice = {}
    for s in spans:
        by_slice.setdefault((s["attributes"]["thread.id"], s["start"] // 10**9), set()).add(s["trace_id"])
    assert all(len(ids) == 1 for ids in by_slice.values()), by_slice
    assert len({s["trace_id"] for s in spans}) == len(slices)
    assert len({s["span_id"] for s in spans}) == len(spans)


def test_http_protocol(pipeline) -> None:  # noqa: ANN001
    proc, calls = run_traced(pipeline.http_endpoint, [["cudaDeviceSynchronize", 7]], "--protocol", "http/protobuf",
                             "--launch-layer", "cuda.runtime")
    assert proc.returncode == 0, proc.stderr[-2000:]
    pid = calls[0]["tid"]
    assert pipeline.store.wait_for(
        lambda: len([s for s in pipeline.store.spans() if s["attributes"].get("process.pid") == pid]) == 7, 20)


def test_exit_status_of_the_command_is_the_agents(pipeline) -> None:  # noqa: ANN001
    from agent_run import agent_cmd
    import subprocess
    import sys

    proc = subprocess.run(agent_cmd(pipeline.grpc_endpoint, "--", sys.executable, "-c", "raise SystemExit(7)"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 7, proc.stderr[-2000:]


def test_opt_in_resource_attributes_reach_the_spans(pipeline) -> None:  # noqa: ANN001
    """resource_environment names the variables a user wants on the spans; argv stays off."""
    proc, calls = run_traced(pipeline.grpc_endpoint, [["cudaSetDevice", 1]], "--launch-layer", "cuda.runtime",
                             env={"OTEL_EACGM_RESOURCE_ENVIRONMENT": "EACGM_JOB_ID", "EACGM_JOB_ID": "job-7",
                                  "EACGM_OTHER": "not-asked-for"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    pid = calls[0]["tid"]
    assert pipeline.store.wait_for(lambda: [s for s in pipeline.store.spans() if s["attributes"].get("process.pid") == pid], 30)
    span, = [s for s in pipeline.store.spans() if s["attributes"].get("process.pid") == pid]
    assert span["resource"]["process.environment_variable.EACGM_JOB_ID"] == "job-7"
    assert not any(k.endswith("EACGM_OTHER") or k == "process.command_args" for k in span["resource"])
