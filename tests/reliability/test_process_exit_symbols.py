"""A traced process that exits before the agent has read its last events keeps its kernel names.

A runtime launch names its kernel by the host stub's ELF symbol, looked up in the process's
memory map. When the agent falls behind (a busy node, a burst of calls) and the process exits
first, that map is gone: the names must come from what the agent read while it lived. The test
makes the agent fall behind for sure: it stops the agent, lets the workload make its launches
and exit (a zombie until the stopped agent reaps it, with an empty map), then lets it go on.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from agent_proc import AgentProcess
from agent_run import PYTHON, WORKLOAD

pytestmark = pytest.mark.ebpf

LAUNCHES = 3


def _state(pid: int) -> str:
    """The process state letter from /proc/PID/stat ("Z" for a zombie)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _wait(predicate, what: str, timeout_s: float = 60) -> None:  # noqa: ANN001 - () -> bool
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_launches_read_after_the_process_exited_keep_their_kernel_names(pipeline, tmp_path: Path) -> None:  # noqa: ANN001
    gate = tmp_path / "go"
    agent = AgentProcess(pipeline.grpc_endpoint, "--launch-layer", "cuda.runtime", "--layers", "cuda.runtime,nccl",
                         env={"EACGM_WAIT_FILE": str(gate), "OTEL_EACGM_GPU_METRICS": "0"},
                         command=[PYTHON, WORKLOAD, json.dumps([["cudaLaunchKernel", LAUNCHES]])])
    stopped = False
    try:
        pid = int(agent.wait_line("launched pid").split("launched pid ", 1)[1].split(":", 1)[0])
        # Both libraries are loaded and attached, and the agent's rescans after the opens are over.
        agent.wait_line("libnccl")
        _wait(lambda: "libnccl" in Path(f"/proc/{pid}/maps").read_text(), "libnccl in the workload's map")
        time.sleep(2.0)
        os.kill(agent.pid, signal.SIGSTOP)
        stopped = True
        gate.touch()
        _wait(lambda: _state(pid) == "Z", "the workload to exit")
        assert Path(f"/proc/{pid}/maps").read_text() == ""  # nothing left to symbolize from
        os.kill(agent.pid, signal.SIGCONT)
        stopped = False
        assert agent.stop_when_exited(timeout_s=90) == 0, agent.log()[-3000:]
    finally:
        if stopped:
            os.kill(agent.pid, signal.SIGCONT)
        if agent.proc.poll() is None:
            agent.stop()

    def launches() -> list[dict]:
        return [s for s in pipeline.store.spans()
                if s["attributes"].get("process.pid") == pid and s["name"] == "cudaLaunchKernel"]
    assert pipeline.store.wait_for(lambda: len(launches()) >= LAUNCHES, 30), agent.log()[-3000:]
    assert [s["attributes"]["cuda.kernel.name"] for s in launches()] == ["cudaGetErrorName"] * LAUNCHES
