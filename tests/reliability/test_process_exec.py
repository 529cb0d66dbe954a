"""A traced process that executes another program keeps its pid and becomes that program.

Its spans must name the program that made each call: the agent's own launcher (a Python
waiter that executes the command once its pid is traced) and a wrapper that executes the real
job (a script ending in `exec`) both do this. The workloads call the real libcudart.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent_proc import AgentProcess
from calls_workload import json_lines, libraries, rate_command

pytestmark = pytest.mark.ebpf

# No OTEL_SERVICE_NAME: service.name is then the executable's name, the attribute under test.
ENV = {"OTEL_SERVICE_NAME": "", "OTEL_EACGM_GPU_METRICS": "0", "OTEL_EACGM_OVERHEAD_BUDGET": "0"}
ARGS = ("--launch-layer", "cuda.runtime", "--layers", "cuda.runtime,nccl")

_CALL_THEN_EXEC = """
import ctypes, os, sys
cudart, binary, nccl = sys.argv[1:4]
lib = ctypes.CDLL(cudart)
for _ in range(5):
    lib.cudaSetDevice(0)
os.execv(binary, [binary, cudart, nccl, "rate", "200", "1"])
"""


def _names_by_call(pipeline, pid: int, expected: int) -> dict[str, set[tuple[str, str]]]:  # noqa: ANN001
    """Per span name, the (service.name, process.executable.name) pairs its spans carried."""
    def mine() -> list[dict]:
        return [s for s in pipeline.store.spans() if s["resource"].get("process.pid") == pid]
    assert pipeline.store.wait_for(lambda: len(mine()) >= expected, 30), len(mine())
    out: dict[str, set[tuple[str, str]]] = {}
    for s in mine():
        out.setdefault(s["name"], set()).add((s["resource"]["service.name"], s["resource"]["process.executable.name"]))
    return out


def _run(pipeline, command: list[str]) -> tuple[AgentProcess, dict[str, int]]:  # noqa: ANN001
    agent = AgentProcess(pipeline.grpc_endpoint, *ARGS, env=ENV, command=command)
    code = agent.stop_when_exited(timeout_s=90)
    assert code == 0, agent.log()[-3000:]
    return agent, agent.done()


def test_a_launched_program_is_named_after_itself_not_the_launcher(pipeline, workload_binary) -> None:  # noqa: ANN001
    agent, done = _run(pipeline, rate_command(workload_binary, 200, 1))
    pid = next(d["pid"] for d in json_lines(agent.stdout) if d.get("ready"))
    names = _names_by_call(pipeline, pid, done["exported"])
    assert names["cudaLaunchKernel"] == {("reliability_calls", "reliability_calls")}, names


def test_calls_before_and_after_an_exec_name_the_program_that_made_them(pipeline, workload_binary) -> None:  # noqa: ANN001
    cudart, nccl = libraries()
    agent, done = _run(pipeline, [sys.executable, "-c", _CALL_THEN_EXEC, cudart, str(workload_binary), nccl])
    pid = next(d["pid"] for d in json_lines(agent.stdout) if d.get("ready"))
    names = _names_by_call(pipeline, pid, done["exported"])
    python = Path(sys.executable).resolve().name
    assert names["cudaSetDevice"] == {(python, python)}, names
    assert names["cudaLaunchKernel"] == {("reliability_calls", "reliability_calls")}, names
    assert done["dropped_ringbuf"] == 0 and done["calls"] == done["exported"], done
