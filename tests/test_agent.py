"""The agent's run loop in-process: its periodic tasks, and one whole run built by the factory
(wiring.build_agent) against the real libcudart/libnccl, launching a command and returning its
exit status, with every call it made counted and exported to the real Collector."""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Iterator

import pytest

from otel_eacgm.agent import every
from otel_eacgm.config import AgentConfig

from agent_run import WORKLOAD


def test_every_runs_at_the_first_tick_then_once_per_interval() -> None:
    ran: list[float] = []
    tick = every(2.0, ran.append)
    for now in (10.0, 10.5, 11.9, 12.0, 13.0, 14.5):
        tick(now)
    assert ran == [10.0, 12.0, 14.5]


@pytest.fixture
def restored_signals() -> Iterator[None]:
    """The agent installs SIGINT/SIGTERM handlers in this (pytest's) process: put them back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.ebpf
@pytest.mark.usefixtures("restored_signals")
def test_a_launched_command_is_traced_whole_and_its_exit_status_returned(pipeline, caplog) -> None:  # noqa: ANN001
    from otel_eacgm.wiring import build_agent  # noqa: PLC0415 - loads BPF: only where eBPF is checked

    plan = [["cudaMalloc", 2], ["cudaLaunchKernel", 5], ["ncclAllReduce", 3]]
    cfg = AgentConfig(endpoint=pipeline.grpc_endpoint, insecure=True, layers=["cuda.runtime", "nccl"],
                      launch_layer="cuda.runtime", span_sample_ratio=1.0, stats_log_interval_s=0.5,
                      python_frames=False)
    script = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__'); sys.exit(3)"
    agent = build_agent(cfg, [sys.executable, "-c", script, WORKLOAD, json.dumps(plan)])
    assert len(agent.tasks()) == 5  # shaper, call statistics, rescans, full scan, stats log

    with caplog.at_level(logging.INFO, logger="otel_eacgm.agent"):
        assert agent.run() == 3
    assert agent.telemetry.counters.calls == 10
    assert agent.telemetry.counters.decode_errors == 0
    done = [r.getMessage() for r in caplog.records if r.getMessage().startswith("done: ")]
    assert len(done) == 1 and "calls=10 " in done[0] and " dropped_ringbuf=0 " in done[0], done
    assert agent.launcher is not None
    pid = agent.launcher.pid
    assert pipeline.store.wait_for(
        lambda: len([s for s in pipeline.store.spans() if s["attributes"].get("process.pid") == pid]) >= 10, 30)
    names = sorted(s["name"] for s in pipeline.store.spans() if s["attributes"].get("process.pid") == pid)
    assert names == sorted(["cudaMalloc"] * 2 + ["cudaLaunchKernel"] * 5 + ["ncclAllReduce"] * 3)
