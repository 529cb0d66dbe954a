"""The Collector goes down under load and comes back: the agent keeps capturing, its memory
stays bounded by its queue, drops are counted, and export resumes at the same address.

benchmarks/soak.py does the same with a 60 s outage inside a 10-minute run.
"""

from __future__ import annotations

import signal
import time

import pytest

from agent_proc import AgentProcess
from calls_workload import json_lines, rate_command, totals
from test_load_accounting import AGENT_ARGS, AGENT_ENV, accounted, self_telemetry

pytestmark = pytest.mark.ebpf

TICKS_PER_S = 3000
OUTAGE_S = 8
QUEUE = 4096
RSS_OUTAGE_LIMIT_KIB = 48 * 1024


def test_collector_down_and_back(workload_binary, own_collector, counter) -> None:  # noqa: ANN001
    sink, _ = counter
    collector = own_collector()
    env = dict(AGENT_ENV, OTEL_EACGM_QUEUE_SIZE=str(QUEUE), OTEL_EACGM_BATCH_SIZE="512",
               OTEL_EACGM_EXPORT_TIMEOUT_S="2")
    agent = AgentProcess(collector.grpc_endpoint, *AGENT_ARGS, env=env,
                         command=rate_command(workload_binary, TICKS_PER_S, 22))
    agent.wait_line(" ready: ")
    pid = None
    deadline = time.monotonic() + 30
    while pid is None:
        pid = next((d["pid"] for d in json_lines(agent.stdout) if d.get("ready")), None)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert sink.wait_for(lambda: sink.spans(pid) > 1000, 20), "no export before the outage"
    before = agent.wait_stats(lambda s: s["calls"] > 0, 5)

    # SIGKILL: a crash, nothing flushed; the agent must not notice beyond failed exports.
    collector.stop(signal.SIGKILL)
    down_at = time.monotonic()
    rss_before = max(kib for t, kib in agent.rss if t <= down_at)
    time.sleep(OUTAGE_S)
    during = agent.stats()
    assert agent.proc.poll() is None, agent.log()[-3000:]
    assert during["calls"] - before["calls"] >= 0.5 * 1.5 * TICKS_PER_S * OUTAGE_S, (before, during)
    assert during["dropped_export"] > 0 and during["export_failures"] > 0, during
    assert during["queued"] <= QUEUE, during
    rss_outage = max(kib for t, kib in agent.rss if t > down_at)
    # Nothing is exported while the Collector is down, so these are the figures at the restart.
    exported_down, sink_down = during["exported"], sink.spans(pid)

    back_at_ns = time.time_ns()
    collector.start()
    # Export resumes: spans of calls made after the restart arrive.
    assert sink.wait_for(lambda: sink.newest_end_ns.get(pid, 0) > back_at_ns, 20), agent.log()[-3000:]

    code = agent.stop_when_exited(timeout_s=60)
    assert code == 0, agent.log()[-3000:]
    done = agent.done()
    work = totals(agent.stdout)
    accounted(work["calls"], done)
    assert done["dropped_export"] >= during["dropped_export"] > 0
    # Every span exported after the restart reached the sink, exactly. Before it, the killed
    # Collector took with it what it had accepted and not yet forwarded (it has no persistent
    # queue): that loss is the Collector's, reported, not the agent's.
    assert sink.wait_for(lambda: sink.spans(pid) - sink_down >= done["exported"] - exported_down, 10)
    assert sink.spans(pid) - sink_down == done["exported"] - exported_down, (sink.spans(pid), sink_down, done)
    assert 0 <= exported_down - sink_down <= 1.5 * TICKS_PER_S, (exported_down, sink_down)
    expected = {k: done[k] for k in ("calls", "exported", "dropped_export", "dropped_ringbuf", "export_failures")}
    assert sink.wait_for(lambda: self_telemetry(sink, agent.pid) == expected, 30), \
        (self_telemetry(sink, agent.pid), expected)
    print(f"outage: {OUTAGE_S}s, rss before {rss_before} KiB, peak during {rss_outage} KiB; "
          f"lost in the killed Collector {exported_down - sink_down}; agent {done}")
    assert rss_outage - rss_before < RSS_OUTAGE_LIMIT_KIB, (rss_before, rss_outage)
    assert "Traceback" not in agent.log()
