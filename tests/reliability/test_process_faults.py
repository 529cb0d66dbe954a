"""Faults of the traced processes: one killed inside a probed call while another runs at load,
and a probed library unloaded (dlclose) and loaded again, over and over."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_proc import AgentProcess
from calls_workload import dlclose_command, json_lines, rate_command
from test_load_accounting import AGENT_ENV, accounted

pytestmark = pytest.mark.ebpf

_HANG = """
import ctypes, os, sys, time
cu = ctypes.CDLL(sys.argv[1])
print("ready", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
cu.cuCtxSynchronize()
print("hang", flush=True)
cu.cuStreamSynchronize(ctypes.c_void_p(0xDEAD))  # the stand-in blocks here until killed
"""


def test_process_killed_mid_call_while_another_is_traced_at_load(workload_binary, standin_libcuda, own_collector,
                                                                  counter, tmp_path: Path) -> None:  # noqa: ANN001
    sink, _ = counter
    collector = own_collector()
    start = tmp_path / "start"
    load = subprocess.Popen(rate_command(workload_binary, 3000, 0), stdout=subprocess.PIPE, text=True)
    hang = subprocess.Popen([sys.executable, "-c", _HANG, str(standin_libcuda), str(start)], stdout=subprocess.PIPE,
                            text=True)
    agent = None
    try:
        load_pid = json_lines([load.stdout.readline()])[0]["pid"]
        assert hang.stdout.readline().strip() == "ready"
        agent = AgentProcess(collector.grpc_endpoint, "--pid", str(load_pid), "--pid", str(hang.pid),
                             "--launch-layer", "cuda.runtime", "--layers", "cuda.runtime,cuda.driver,nccl", env=AGENT_ENV)
        agent.wait_line(" ready: ")
        start.touch()
        assert hang.stdout.readline().strip() == "hang"
        time.sleep(0.3)
        hang.kill()  # SIGKILL inside cuStreamSynchronize: its return probe never fires
        hang.wait(10)
        killed_ns = time.time_ns()
        s = agent.wait_stats(lambda s: s["incomplete"] == 1, 20)
        # The agent goes on capturing the other process, and exports what it captures.
        assert sink.wait_for(lambda: sink.newest_end_ns.get(load_pid, 0) > killed_ns + 10**9, 20)
        assert agent.wait_stats(lambda t: t["calls"] > s["calls"] + 3000, 20)
        assert sink.wait_for(lambda: sink.spans(hang.pid) >= 3, 20)  # cuCtxSynchronize, its nested and the open call
        code = agent.stop(signal.SIGTERM)
        assert code == 0, agent.log()[-3000:]
        done = agent.done()
        assert done["incomplete"] == 1 and done["calls"] == done["exported"] + done["dropped_export"], done
        assert "Traceback" not in agent.log()
    finally:
        for p in (load, hang):
            if p.poll() is None:
                p.kill()
            p.wait(10)
        if agent is not None and agent.proc.poll() is None:
            agent.stop(signal.SIGKILL)


def test_library_unloaded_while_probed_and_loaded_again(workload_binary, own_collector, counter) -> None:  # noqa: ANN001
    sink, _ = counter
    collector = own_collector()
    cycles, calls = 8, 2000
    agent = AgentProcess(collector.grpc_endpoint, "--launch-layer", "cuda.runtime", "--layers", "cuda.runtime,nccl",
                         env=AGENT_ENV, command=dlclose_command(workload_binary, cycles, calls))
    code = agent.stop_when_exited(timeout_s=120)
    assert code == 0, agent.log()[-3000:]
    lines = json_lines(agent.stdout)
    done_cycles = [d for d in lines if "cycle" in d]
    assert len(done_cycles) == cycles
    assert all(d["dlclose"] == 0 and d["unmapped"] for d in done_cycles), done_cycles  # really unloaded each time
    done = agent.done()
    accounted(cycles * calls, done)
    assert done["dropped_ringbuf"] == 0, done  # a slow trickle: every call of every cycle is captured
    pid = next(d["pid"] for d in lines if d.get("ready"))
    assert sink.wait_for(lambda: sink.spans(pid) == done["exported"], 20)
    assert "Traceback" not in agent.log() and "undecodable" not in agent.log()
