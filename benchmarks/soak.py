"""Soak: the agent under a steady high call rate for ten minutes, with a Collector outage.

A C workload (tests/reliability/reliability_calls.c) calls the real libcudart and libnccl at a
paced rate; `otel-eacgm agent -- workload` exports through the real Collector to a counting
sink. At --outage-at-s the Collector is killed (SIGKILL) and restarted --outage-s later on the
same port. Every 10 s one line: agent counters and RSS. At the end, the figures
docs/reliability.md records: every call accounted for (workload calls = captured + ring-buffer
drops; captured = exported + export drops), the sink's span count, the agent's self-telemetry
as the Collector delivered it, RSS per phase, CPU time. Exits 1 when an identity fails.

usage: soak.py [--minutes 10] [--ticks-per-s 10000] [--outage-at-s 240] [--outage-s 60]
       (1.5 calls per tick: a cudaLaunchKernel each, an ncclGroupStart/End pair every fourth)
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests/reliability")]

import otlp_counter  # noqa: E402
from agent_proc import AgentProcess  # noqa: E402
from calls_workload import build, json_lines, rate_command, totals  # noqa: E402
from collector_proc import CollectorProcess  # noqa: E402
from proc_stat import proc_stat  # noqa: E402


def phase_rss(agent: AgentProcess, start: float, end: float) -> str:
    """min / median / max RSS (MiB) of the samples in [start, end)."""
    kib = [k for t, k in agent.rss if start <= t < end]
    if not kib:
        return "no samples"
    return f"{min(kib) / 1024:.1f} / {statistics.median(kib) / 1024:.1f} / {max(kib) / 1024:.1f} MiB"


def workload_pid(agent: AgentProcess) -> int:
    """The traced workload's pid, from its first line."""
    return next(d["pid"] for d in json_lines(agent.stdout) if d.get("ready"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--ticks-per-s", type=int, default=10000)
    p.add_argument("--outage-at-s", type=float, default=240.0)
    p.add_argument("--outage-s", type=float, default=60.0)
    args = p.parse_args()
    seconds = args.minutes * 60
    work_dir = Path(tempfile.mkdtemp(prefix="eacgm-soak-"))
    server, sink, sink_port = otlp_counter.serve()
    collector = CollectorProcess(sink_port, work_dir / "collector.log").start()
    # Every span exported, and the overhead guardrail off (it would leave calls uncaptured on
    # purpose): the run counts calls.
    env = {"OTEL_EACGM_METRICS_INTERVAL_S": "5", "OTEL_EACGM_SPAN_SAMPLE_RATIO": "1", "OTEL_EACGM_GPU_METRICS": "0",
           "OTEL_EACGM_STATS_LOG_INTERVAL_S": "5", "OTEL_EACGM_OVERHEAD_BUDGET": "0"}
    agent = AgentProcess(collector.grpc_endpoint, "--launch-layer", "cuda.runtime", "--layers", "cuda.runtime,nccl",
                         env=env, command=rate_command(build(work_dir), args.ticks_per_s, seconds), rss_interval_s=1.0)
    agent.wait_line(" ready: ")
    t0 = time.monotonic()
    print(f"soak: {args.minutes:g} min at {args.ticks_per_s} ticks/s ({1.5 * args.ticks_per_s:.0f} calls/s), "
          f"Collector down at {args.outage_at_s:g} s for {args.outage_s:g} s; work dir {work_dir}", flush=True)
    down_at = up_at = None
    exported_down = sink_down = None
    cpu = None
    next_line = t0
    while agent.proc.poll() is None:
        now = time.monotonic()
        if down_at is None and now - t0 >= args.outage_at_s:
            collector.stop(signal.SIGKILL)
            down_at = now
            print(f"{now - t0:6.0f}s  Collector killed", flush=True)
        if down_at is not None and up_at is None and now - down_at >= args.outage_s:
            # Nothing is exported while the Collector is down: the figures at the restart.
            exported_down, sink_down = agent.stats().get("exported"), sink.spans(workload_pid(agent))
            collector.start()
            up_at = now
            print(f"{now - t0:6.0f}s  Collector restarted", flush=True)
        cpu = sample.cpu_s if (sample := proc_stat(agent.pid)) is not None else cpu
        if now >= next_line:
            next_line += 10
            s = agent.stats()
            rss = agent.rss[-1][1] / 1024 if agent.rss else 0
            print(f"{now - t0:6.0f}s  calls={s.get('calls')} exported={s.get('exported')} queued={s.get('queued')} "
                  f"dropped_export={s.get('dropped_export')} dropped_ringbuf={s.get('dropped_ringbuf')} "
                  f"export_failures={s.get('export_failures')} rss={rss:.1f} MiB", flush=True)
        time.sleep(0.5)
    code = agent.stop_when_exited(timeout_s=120)
    end = time.monotonic()
    if up_at is None:
        raise SystemExit("the run ended before the Collector was restarted: lengthen --minutes")
    done = agent.done()
    work = totals(agent.stdout)
    pid = workload_pid(agent)
    sink.wait_for(lambda: sink.spans(pid) - sink_down >= done["exported"] - exported_down, 30)
    sink.wait_for(lambda: sink.agent_metric(agent.pid, "eacgm.agent.calls") == done["calls"], 30)
    telemetry = {
        "calls": sink.agent_metric(agent.pid, "eacgm.agent.calls"),
        "exported": sink.agent_metric(agent.pid, "eacgm.agent.spans.exported"),
        "dropped_export": sink.agent_metric(agent.pid, "eacgm.agent.dropped", **{"eacgm.drop.reason": "export"}),
        "dropped_ringbuf": sink.agent_metric(agent.pid, "eacgm.agent.dropped", **{"eacgm.drop.reason": "ringbuf"}),
    }
    checks = {
        "agent exit status 0": code == 0,
        "workload calls == captured + ring-buffer drops": work["calls"] == done["calls"] + done["dropped_ringbuf"],
        "captured == exported + export drops": done["calls"] == done["exported"] + done["dropped_export"],
        "nothing left queued or held": done["queued"] == 0 and done["held"] == 0,
        "self-telemetry == final counters": telemetry == {k: done[k] for k in telemetry},
        "every span exported after the restart reached the sink":
            sink.spans(pid) - sink_down == done["exported"] - exported_down,
    }
    print(f"\nworkload: {work} in {seconds:.0f} s ({work['calls'] / seconds:.0f} calls/s)")
    print(f"agent done: {done}")
    print(f"sink: {sink.spans(pid)} spans of the workload; lost in the killed Collector (accepted, not "
          f"forwarded): {exported_down - sink_down}; self-telemetry via the Collector: {telemetry}")
    warm = t0 + 30
    print(f"RSS min/median/max: before the outage (30 s..) {phase_rss(agent, warm, down_at)}; "
          f"during {phase_rss(agent, down_at, up_at)}; after {phase_rss(agent, up_at, end)}")
    first = [k for t, k in agent.rss if warm <= t < warm + 60]
    last = [k for t, k in agent.rss if end - 60 <= t < end]
    if first and last:
        print(f"RSS first minute after warm-up {max(first) / 1024:.1f} MiB, last minute {max(last) / 1024:.1f} MiB")
    if cpu is not None:
        print(f"agent CPU: {cpu:.1f} s over {end - t0:.0f} s ({100 * cpu / (end - t0):.0f} % of one core)")
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    if collector.alive():
        collector.stop()
    server.stop(0)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
