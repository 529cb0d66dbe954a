"""The whole agent's CPU and memory while it traces a steady call load, with every metric on.

The agent (`otel-eacgm agent -- call_loop ...`, all metric sources: call statistics, GPU where
NVML works, network, InfiniBand, TCP retransmits) exports to an OTLP store in this process.
The load is benchmarks/call_loop.c launching `cudaLaunchKernel` at a fixed rate. Each
configuration (metric interval x span sampling ratio) runs in interleaved rounds; the agent's
CPU seconds (utime + stime from /proc) are taken between the child's start and its end, so
BCC's start-up compile is left out and reported apart. Medians over rounds are printed.

    sudo .venv/bin/python benchmarks/agent_cpu.py --seconds 30 --rounds 2 --rate 10000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from eacgm_testkit.otlp_store import serve  # noqa: E402
from probe_overhead import build_loop, find_libraries  # noqa: E402
from proc_stat import proc_stat  # noqa: E402

def _cpu_rss(pid: int) -> tuple[float, float] | None:
    """(CPU seconds, RSS MiB) of a live process, None once it is gone."""
    s = proc_stat(pid)
    return None if s is None or s.state == "Z" else (s.cpu_s, s.rss_mib)


def one_run(endpoint: str, loop: list[str], interval_s: float, ratio: float) -> dict:
    """One traced run of the loop; the agent's figures while the loop ran."""
    env = dict(os.environ, OTEL_EACGM_METRICS_INTERVAL_S=str(interval_s), OTEL_EACGM_SPAN_SAMPLE_RATIO=str(ratio),
               OTEL_EACGM_LAUNCH_LAYER="cuda.runtime", OTEL_EACGM_LOG_LEVEL="info")
    cmd = [sys.executable, "-m", "otel_eacgm.cli", "agent", "--endpoint", endpoint, "--insecure", "--", *loop]
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    started = threading.Event()
    log: list[str] = []

    def read_stderr() -> None:
        assert agent.stderr is not None
        for line in agent.stderr:
            log.append(line)
            if "launched pid" in line:
                started.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    if not started.wait(120):
        agent.kill()
        raise RuntimeError("agent did not start:\n" + "".join(log[-30:]))
    t0 = time.monotonic()
    first = _cpu_rss(agent.pid)
    samples = []
    while True:
        s = _cpu_rss(agent.pid)
        if s is None or any("done:" in line for line in log[-3:]):
            break
        samples.append((time.monotonic(), *s))
        if agent.poll() is not None:
            break
        time.sleep(0.25)
    out, _ = agent.communicate(timeout=120)
    reader.join(5)
    if agent.returncode != 0 or first is None or len(samples) < 2:
        raise RuntimeError(f"agent exit {agent.returncode}:\n" + "".join(log[-30:]))
    # the last sample before the child's exit flush: the steady part of the run
    t1, cpu1, _ = samples[-2]
    loop_result = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    done = [line for line in log if " done: " in line][-1].split(" done: ", 1)[1]
    counters = dict(kv.split("=") for kv in done.split() if "=" in kv)
    return {
        "startup_cpu_s": round(first[0], 2),
        "cpu_s_per_min": (cpu1 - first[0]) / (t1 - t0) * 60,
        "rss_mib": max(r for *_, r in samples),
        "calls": int(counters["calls"]),
        "received": int(counters["received"]),
        "dropped": int(counters["dropped_ringbuf"]) + int(counters["dropped_export"]),
        "launch_ns": loop_result["launch_ns"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rate", type=float, default=10000, help="launches per second")
    ap.add_argument("--intervals", default="1,10", help="metric export intervals, s")
    ap.add_argument("--ratios", default="0.1,1", help="span sampling ratios")
    args = ap.parse_args()
    rt, nccl = find_libraries()
    binary = build_loop(REPO / "build")
    loop = [str(binary), rt, nccl, str(int(args.rate * args.seconds)), str(args.rate)]
    server, store, port = serve()
    endpoint = f"http://127.0.0.1:{port}"
    configs = [(float(i), float(r)) for i in args.intervals.split(",") for r in args.ratios.split(",")]
    results: dict[tuple[float, float], list[dict]] = {c: [] for c in configs}
    for rnd in range(args.rounds):
        for c in configs:
            r = one_run(endpoint, loop, *c)
            results[c].append(r)
            print(f"round {rnd + 1} interval {c[0]:g} s ratio {c[1]:g}: {r}", file=sys.stderr, flush=True)
    server.stop(0)
    print(f"\nagent CPU and memory, {args.rate:g} launches/s for {args.seconds:g} s, all metrics on; "
          f"medians of {args.rounds} interleaved rounds ({os.cpu_count()} CPUs)\n")
    print("| metric interval | span sampling | agent CPU s/min | agent CPU % of a core | RSS MiB | calls captured | records received | dropped |")
    print("|---|---|---|---|---|---|---|---|")
    for (interval, ratio), rs in results.items():
        cpu = statistics.median(r["cpu_s_per_min"] for r in rs)
        print(f"| {interval:g} s | {ratio:g} | {cpu:.2f} | {cpu / 60 * 100:.1f} | "
              f"{statistics.median(r['rss_mib'] for r in rs):.0f} | {statistics.median(r['calls'] for r in rs):.0f} | "
              f"{statistics.median(r['received'] for r in rs):.0f} | {max(r['dropped'] for r in rs)} |")
    print(f"\nBCC start-up (compile and attach, before the load): median "
          f"{statistics.median(r['startup_cpu_s'] for rs in results.values() for r in rs):.1f} CPU s")


if __name__ == "__main__":
    main()
