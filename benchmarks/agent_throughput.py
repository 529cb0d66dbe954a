"""Span throughput of the agent at 100 % spans: CPU per span, drops, RSS, spans that arrive.

The load is benchmarks/call_loop.c making N failing `cudaFree` calls (libcudart from the
nvidia-cuda-runtime wheel; no GPU, so each returns a real error code), paced at --rate calls/s
(0: as fast as it goes). The agent (`otel-eacgm agent --span-sample-ratio 1 -- call_loop ...`)
exports over OTLP/gRPC to the test OTLP store in this process, which counts what arrives.

How the agent's CPU is counted: utime + stime of the agent process itself (all its threads:
ring-buffer poll, span building, the export thread and gRPC), not of its children, read from
/proc/PID/stat at the "launched pid" line (probes attached, BCC's compile done: reported apart
as start-up) and again at its "done:" line, which it logs once the span queue is closed (every
span exported, the last metrics too): spans per agent CPU-second = spans received / that CPU.
What it spends after that (releasing the probes, closing the BPF program) is shown apart, read
once the agent has exited (a zombie not yet reaped keeps its counters).

Each source tree given with --tree (NAME=PATH, the agent run from that checkout) runs once per
round, rounds interleaved; medians are printed.

    sudo .venv/bin/python benchmarks/agent_throughput.py --calls 100000 --rate 20000 --rounds 3
"""

from __future__ import annotations

import argparse
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


def one_run(tree: Path, endpoint: str, loop: list[str], ringbuf_pages: int, store_count) -> dict:  # noqa: ANN001
    """One traced run of the loop with the agent of `tree`; its figures."""
    env = dict(os.environ, OTEL_EACGM_SPAN_SAMPLE_RATIO="1", OTEL_EACGM_LOG_LEVEL="info",
               OTEL_EACGM_CALL_METRICS="false", OTEL_EACGM_RINGBUF_PAGES=str(ringbuf_pages),
               PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "otel_eacgm.cli", "agent", "--endpoint", endpoint, "--insecure",
           "--layers", "cuda.runtime", "--launch-layer", "cuda.runtime", "--", *loop]
    before = store_count()
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tree)
    started = threading.Event()
    log: list[str] = []
    start: list[float] = []
    exported: list[float] = []

    def read_stderr() -> None:
        assert agent.stderr is not None
        for line in agent.stderr:
            if " done: " in line and not exported:  # logged once the queue is closed: every span exported
                exported.append(proc_stat(agent.pid).cpu_s)
            log.append(line)
            if "launched pid" in line and not start:
                start.append(proc_stat(agent.pid).cpu_s)
                started.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    if not started.wait(180):
        agent.kill()
        raise RuntimeError("agent did not start:\n" + "".join(log[-30:]))
    t0 = time.monotonic()
    rss = 0.0
    while True:  # sample RSS until the agent is a zombie: its CPU counters are final then
        sample = proc_stat(agent.pid)
        if sample.state == "Z":
            break
        rss = max(rss, sample.rss_mib)
        time.sleep(0.1)
    wall = time.monotonic() - t0
    out, _ = agent.communicate(timeout=60)
    reader.join(5)
    if agent.returncode not in (0, 1):  # the loop's exit status; 1 would be its own failure
        raise RuntimeError(f"agent exit {agent.returncode}:\n" + "".join(log[-30:]))
    done = [line for line in log if " done: " in line]
    if not done:
        raise RuntimeError("no done: line\n" + "".join(log[-30:]))
    counters = dict(kv.split("=", 1) for kv in done[-1].split(" done: ", 1)[1].split() if "=" in kv)
    time.sleep(0.5)  # the store's last Export returned before the agent exited; let its lock go
    received = store_count() - before
    agent_cpu = exported[0] - start[0]
    return {
        "startup_cpu_s": round(start[0], 2), "agent_cpu_s": round(agent_cpu, 2), "wall_s": round(wall, 2),
        "cpu_to_exit_s": round(sample.cpu_s - start[0], 2),
        "received": received, "spans_per_cpu_s": round(received / agent_cpu) if agent_cpu else 0,
        "cpu_s_per_million": round(agent_cpu / max(received, 1) * 1e6, 1), "rss_mib": round(rss, 1),
        "dropped_ringbuf": int(counters.get("dropped_ringbuf", -1)),
        "dropped_export": int(counters.get("dropped_export", -1)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=20_000, help="calls per second (0: unpaced)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ringbuf-pages", type=int, default=4096)
    ap.add_argument("--tree", action="append", default=[],
                    help="NAME=PATH: an agent source tree to compare (default: this checkout)")
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree) or {"this": str(REPO)}
    rt, nccl = find_libraries()
    binary = build_loop(REPO / "build")
    loop = [str(binary), rt, nccl, "free", str(args.calls), str(args.rate)]
    server, store, port = serve()
    endpoint = f"http://127.0.0.1:{port}"

    def count() -> int:
        with store._lock:  # noqa: SLF001 - a count without building every span's dict
            return sum(len(ss.spans) for req in store.traces for rs in req.resource_spans for ss in rs.scope_spans)

    results: dict[str, list[dict]] = {name: [] for name in trees}
    for rnd in range(args.rounds):
        for name, path in trees.items():
            r = one_run(Path(path), endpoint, loop, args.ringbuf_pages, count)
            results[name].append(r)
            print(f"round {rnd + 1} {name}: {r}", file=sys.stderr, flush=True)
            with store._lock:  # noqa: SLF001 - keep the store's memory out of the next run
                store.traces.clear()
                store.metrics.clear()
    server.stop(0)
    print(f"\n{args.calls} failing cudaFree calls at {args.rate:g}/s (0: unpaced), 100 % spans, OTLP/gRPC to an "
          f"in-process store; medians of {args.rounds} interleaved rounds ({os.cpu_count()} CPUs)\n")
    print("| agent | spans received | dropped (ring, export) | agent CPU s, launch to done | "
          "spans per agent CPU-s | agent CPU s per million spans | CPU s, launch to exit | RSS MiB | wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"| {name} | {med['received']:.0f} | {max(r['dropped_ringbuf'] for r in rs)}, "
              f"{max(r['dropped_export'] for r in rs)} | {med['agent_cpu_s']:.2f} | "
              f"{med['spans_per_cpu_s']:.0f} | "
              f"{med['cpu_s_per_million']:.1f} | {med['cpu_to_exit_s']:.2f} | {med['rss_mib']:.0f} | {med['wall_s']:.1f} |")
    print(f"\nBCC start-up before the load (compile, attach): median "
          f"{statistics.median(r['startup_cpu_s'] for rs in results.values() for r in rs):.1f} CPU s")


if __name__ == "__main__":
    main()
