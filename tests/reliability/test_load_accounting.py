"""The agent at a high call rate: every call is exported or counted as dropped, memory is flat.

The short CI version of benchmarks/soak.py (10 minutes). The real Collector sits between the
agent and a counting sink; the agent's own self-telemetry, read back through the Collector,
must tell the same story as its final log line and as the sink's span count.
"""

from __future__ import annotations

import os
import time

import pytest

from agent_proc import AgentProcess
from calls_workload import json_lines, rate_command, totals

pytestmark = pytest.mark.ebpf

TICKS_PER_S = int(os.environ.get("RELIABILITY_TICKS_PER_S", "10000"))  # 1.5 calls per tick
SECONDS = 15
# The overhead guardrail is off: while it holds launch probes detached, calls are knowingly
# not captured (its own tests check the extrapolated statistics), and these tests count calls.
AGENT_ENV = {"OTEL_EACGM_METRICS_INTERVAL_S": "1", "OTEL_EACGM_SPAN_SAMPLE_RATIO": "1",
             "OTEL_EACGM_GPU_METRICS": "0", "OTEL_EACGM_OVERHEAD_BUDGET": "0"}
AGENT_ARGS = ("--launch-layer", "cuda.runtime", "--layers", "cuda.runtime,nccl")
RSS_GROWTH_LIMIT_KIB = 16 * 1024
# Where the exporter is slower than the capture (this 2-core VM exports about 7.5k spans/s of
# the 10k/s captured), the default 65536-span queue fills at about 1 KiB per span for the
# whole run: growth of a bounded backlog, not a leak. 4096 spans fill within a second, so
# what RSS does after that is the agent's own, and the drops on export that follow are
# counted like any others.
LOAD_QUEUE_SIZE = 4096


def accounted(workload_calls: int, done: dict[str, int]) -> None:
    """The accounting identities every run must satisfy (the soak checks the same).

    The workload's calls are captured or lost in the ring buffer (counted); captured calls
    are exported, dropped on export (counted) or left out by sampling (counted). These runs
    export every span (ratio 1), so nothing may be sampled out.
    """
    assert done["queued"] == 0 and done["held"] == 0 and done["sampled_out"] == 0, done
    assert workload_calls == done["calls"] + done["dropped_ringbuf"], (workload_calls, done)
    assert done["calls"] == done["exported"] + done["dropped_export"] + done["sampled_out"], done
    assert done["depth_overflow"] == 0 and done["unmatched_returns"] == 0, done


def self_telemetry(counter, agent_pid: int) -> dict[str, float | None]:  # noqa: ANN001 - otlp_counter.Counter
    """The agent's eacgm.agent.* figures as the Collector delivered them."""
    return {
        "calls": counter.agent_metric(agent_pid, "eacgm.agent.calls"),
        "exported": counter.agent_metric(agent_pid, "eacgm.agent.spans.exported"),
        "dropped_export": counter.agent_metric(agent_pid, "eacgm.agent.dropped", **{"eacgm.drop.reason": "export"}),
        "dropped_ringbuf": counter.agent_metric(agent_pid, "eacgm.agent.dropped", **{"eacgm.drop.reason": "ringbuf"}),
        "export_failures": counter.agent_metric(agent_pid, "eacgm.agent.export.failures"),
    }


def test_every_call_at_high_rate_is_exported_or_counted_and_rss_is_flat(workload_binary, own_collector, counter) -> None:  # noqa: ANN001
    sink, _ = counter
    collector = own_collector()
    agent = AgentProcess(collector.grpc_endpoint, *AGENT_ARGS,
                         env=dict(AGENT_ENV, OTEL_EACGM_QUEUE_SIZE=str(LOAD_QUEUE_SIZE)),
                         command=rate_command(workload_binary, TICKS_PER_S, SECONDS))
    agent.wait_line(" ready: ")
    ready_at = time.monotonic()
    code = agent.stop_when_exited(timeout_s=SECONDS + 90)
    assert code == 0, agent.log()[-3000:]
    done = agent.done()
    work = totals(agent.stdout)
    pid = next(d["pid"] for d in json_lines(agent.stdout) if d.get("ready"))
    assert work["calls"] >= 0.9 * 1.5 * TICKS_PER_S * SECONDS, work  # the rate was really offered
    accounted(work["calls"], done)
    assert done["calls"] >= 0.5 * work["calls"], done  # not a run that lost most calls and counted them
    # Every span the agent counts as exported reached the end of the pipeline, once.
    assert sink.wait_for(lambda: sink.spans(pid) >= done["exported"], 30)
    assert sink.spans(pid) == done["exported"]
    # Self-telemetry, through the Collector, agrees with the final log line.
    expected = {k: done[k] for k in ("calls", "exported", "dropped_export", "dropped_ringbuf", "export_failures")}
    assert sink.wait_for(lambda: self_telemetry(sink, agent.pid) == expected, 30), \
        (self_telemetry(sink, agent.pid), expected)
    first, peak, growth = agent.rss_growth_kib(since=ready_at + 3)
    print(f"load: workload {work} agent {done} rss first={first} peak={peak} growth={growth} KiB")
    assert growth < RSS_GROWTH_LIMIT_KIB, (first, peak, growth, agent.rss[-20:])
    assert "Traceback" not in agent.log()
