"""The agent restarted under a running workload: SIGTERM, then SIGKILL. Each new agent
re-attaches to the process it is given, and each exit leaves no probe in the kernel.

The workload calls copies of libcudart/libnccl (own inodes), so the breakpoint check sees this
test's probes only, whatever other agents on the machine trace.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agent_proc import AgentProcess
from agent_run import agent_cmd
from calls_workload import private_libraries, rate_command, totals
from probe_residue import INT3, first_byte, perf_event_fds, wait_until_clean
from test_load_accounting import AGENT_ENV

pytestmark = pytest.mark.ebpf

ARGS = ("--launch-layer", "cuda.runtime", "--layers", "cuda.runtime,nccl")


def _attach_and_trace(endpoint: str, pid: int, sink, addresses: list[int]) -> AgentProcess:  # noqa: ANN001
    agent = AgentProcess(endpoint, "--pid", str(pid), *ARGS, env=AGENT_ENV)
    agent.wait_line(" ready: ")
    before = sink.spans(pid)
    assert sink.wait_for(lambda: sink.spans(pid) > before + 500, 30), f"no spans after re-attach:\n{agent.log()[-3000:]}"
    assert [first_byte(pid, a) for a in addresses] == [INT3] * len(addresses), "probes not visible as breakpoints"
    assert perf_event_fds(agent.pid) > 0
    return agent


def test_sigterm_then_sigkill_reattach_and_leave_no_probes(workload_binary, own_collector, counter, tmp_path: Path) -> None:  # noqa: ANN001
    sink, _ = counter
    collector = own_collector()
    libs = private_libraries(tmp_path / "libs")
    workload = subprocess.Popen(rate_command(workload_binary, 2000, 0, libs), stdout=subprocess.PIPE, text=True)
    try:
        ready = json.loads(workload.stdout.readline())
        pid = ready["pid"]
        addresses = [int(ready["launch_addr"], 16), int(ready["group_start_addr"], 16)]
        originals = [first_byte(pid, a) for a in addresses]
        assert INT3 not in originals, "another tracer already probes this test's private libraries"
        cmdline = agent_cmd(collector.grpc_endpoint, "--pid", str(pid), *ARGS)
        timings = {}
        for sig in (signal.SIGTERM, signal.SIGKILL):
            agent = _attach_and_trace(collector.grpc_endpoint, pid, sink, addresses)
            stopped_at = time.monotonic()
            code = agent.stop(sig)
            if sig == signal.SIGTERM:
                assert code == 0, agent.log()[-3000:]
                done = agent.done()
                assert done["calls"] == done["exported"] + done["dropped_export"] + done["sampled_out"], done
                assert "Traceback" not in agent.log()
            else:
                assert code == -signal.SIGKILL
            wait_until_clean(pid, addresses, originals, cmdline, libs[0], timeout_s=60)
            timings[sig.name] = time.monotonic() - stopped_at
            assert workload.poll() is None, "the workload died when the probes went"
        print(f"agent restart: probes gone {timings} after the agent was stopped")
    finally:
        workload.terminate()
        out, _ = workload.communicate(timeout=30)
    assert workload.returncode == 0
    assert totals(out.splitlines())["calls"] > 0
