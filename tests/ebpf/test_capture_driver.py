"""Driver-layer capture on a stand-in libcuda (no NVIDIA driver can exist here).

The stand-in is a real ELF file with the driver's symbols and signatures, so the uprobes,
in-kernel nesting, name records and argument decoding are exercised for real; the real
driver is covered on the GPU machine (docs/gpu-validation.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_run import agent_cmd, summary

pytestmark = pytest.mark.ebpf
WORKLOAD = str(Path(__file__).resolve().parent.parent / "workloads/driver_calls.py")


def _spans_of(store, pid: int, n: int, timeout: float = 30) -> list[dict]:  # noqa: ANN001
    got = lambda: [s for s in store.spans() if s["attributes"].get("process.pid") == pid]  # noqa: E731
    store.wait_for(lambda: len(got()) >= n, timeout)
    return got()


@pytest.fixture(scope="module")
def driver_run(pipeline, standin_libcuda):  # noqa: ANN001, ANN201
    steps = ["names", "lib", "launch", "launch", "launch_ex", "launch_null", "ctx_sync", "alloc_free", "copy"]
    proc = subprocess.run(agent_cmd(pipeline.grpc_endpoint, "--", sys.executable, WORKLOAD, str(standin_libcuda), *steps),
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OTEL_EACGM_LAUNCH_RETURNS="true"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    pid = int(proc.stderr.split("launched pid ", 1)[1].split(":", 1)[0])
    # names 1, lib 2, launches 4, ctx_sync 2 (nested), alloc_free 2, copy 1
    return proc, _spans_of(pipeline.store, pid, 12)


def test_driver_launches_are_named_from_name_records(driver_run) -> None:  # noqa: ANN001
    _, spans = driver_run
    launches = [s for s in spans if s["name"] == "cuLaunchKernel"]
    assert len(launches) == 3
    named = [s for s in launches if s["attributes"]["cuda.kernel.name"] == "vector_add(float*, float*, float*, int)"]
    assert len(named) == 2
    a = named[0]["attributes"]
    assert a["cuda.grid"] == [8, 4, 2] and a["cuda.block"] == [256, 1, 1]
    assert a["cuda.shared_mem.bytes"] == 1024 and a["cuda.stream"] == "0x99"  # stack arguments 8 and 9
    assert a["eacgm.layer"] == "cuda.driver" and named[0]["status_code"] == 0
    ex = next(s for s in spans if s["name"] == "cuLaunchKernelEx")["attributes"]
    assert ex["cuda.kernel.name"] == "void reduce<float>(float*, int)"  # via cuLibraryGetKernel + cuKernelGetFunction
    assert ex["cuda.grid"] == [16, 1, 1] and ex["cuda.block"] == [128, 2, 1]
    assert ex["cuda.shared_mem.bytes"] == 2048 and ex["cuda.stream"] == "0x98"


def test_launch_errors_with_launch_returns(driver_run) -> None:  # noqa: ANN001
    _, spans = driver_run
    bad = [s for s in spans if s["name"] == "cuLaunchKernel" and s["attributes"]["cuda.kernel.name"] == "[unknown]"]
    assert len(bad) == 1
    assert bad[0]["status_code"] == 2 and bad[0]["attributes"]["error.type"] == "CUDA_ERROR_INVALID_HANDLE"


def test_nested_driver_call_is_a_child_not_a_second_top_level_call(driver_run) -> None:  # noqa: ANN001
    _, spans = driver_run
    outer = next(s for s in spans if s["name"] == "cuCtxSynchronize")
    inner = next(s for s in spans if s["name"] == "cuStreamSynchronize")
    assert outer["parent_span_id"] == ""
    assert inner["parent_span_id"] == outer["span_id"] and inner["trace_id"] == outer["trace_id"]
    assert outer["start"] <= inner["start"] <= inner["end"] <= outer["end"]


def test_free_reports_the_size_of_its_allocation(driver_run) -> None:  # noqa: ANN001
    _, spans = driver_run
    alloc = next(s for s in spans if s["name"] == "cuMemAlloc_v2")["attributes"]
    free = next(s for s in spans if s["name"] == "cuMemFree_v2")["attributes"]
    assert alloc["cuda.memory.bytes"] == free["cuda.memory.bytes"] == 4096
    assert alloc["cuda.memory.address"] == free["cuda.memory.address"] == hex(0x7F0000000000 + 4096)
    copy = next(s for s in spans if s["name"] == "cuMemcpyHtoDAsync_v2")["attributes"]
    assert copy["cuda.memory.bytes"] == 777 and copy["cuda.memcpy.kind"] == "HostToDevice" and copy["cuda.stream"] == "0x97"


def test_process_killed_inside_a_call(pipeline, standin_libcuda) -> None:  # noqa: ANN001
    """The call open when the process dies is reported as an incomplete, failed span."""
    agent = subprocess.Popen(agent_cmd(pipeline.grpc_endpoint, "--", sys.executable, WORKLOAD, str(standin_libcuda),
                                       "ctx_sync", "hang"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = None
    deadline = time.monotonic() + 60
    for line in agent.stdout:  # the workload's lines come through the agent's stdout
        if '"hang"' in line:
            hang_t0 = json.loads(line)["t0"]
            break
        assert time.monotonic() < deadline
    time.sleep(0.3)
    pid = int(subprocess.run(["pgrep", "-f", f"driver_calls.py {standin_libcuda} ctx_sync hang"],
                             capture_output=True, text=True).stdout.split()[-1])
    os.kill(pid, signal.SIGKILL)
    _, err = agent.communicate(timeout=60)
    assert agent.returncode == 128 + signal.SIGKILL, err[-2000:]
    assert summary(err)["incomplete"] == 1
    spans = _spans_of(pipeline.store, pid, 3)
    hung = [s for s in spans if s["name"] == "cuStreamSynchronize" and s["attributes"].get("eacgm.call.incomplete")]
    assert len(hung) == 1
    assert hung[0]["status_code"] == 2 and hung[0]["attributes"]["error.type"] == "eacgm.thread_exited"
    assert hung[0]["attributes"]["cuda.stream"] == "0xdead"
    assert hung[0]["start"] >= hang_t0 - 2_000_000 and hung[0]["end"] - hung[0]["start"] >= 250_000_000
