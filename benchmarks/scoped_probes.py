"""What tracing one process costs a neighbour that maps the same libraries, with probes scoped
to the traced process (scoped_probes: true, the default with --pid) and on the library file
(scoped_probes: false), side by side in one run.

A target process maps the wheel's libcudart and libnccl and sleeps; the agent traces it with
--pid. The neighbour, outside the scope, is benchmarks/call_loop.c: cudaLaunchKernel (entry
probe) and ncclGroupStart+ncclGroupEnd (entry+return probes) in tight loops, timed in-process.
Each round runs the neighbour untraced (no agent), beside a scoped agent and beside a file-wide
agent, in a rotating order; the table gives medians over rounds and ratios to untraced.

Part 2, the price of the guarantee for the traced job: with scoped probes a traced process's
new child is stopped at its birth until the agent has linked its libraries. The target forks
children that exit at once; fork+wait time, median per mode (no agent / scoped / file-wide).

usage: scoped_probes.py [--rounds 5] [--iterations 200000] [--forks 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from eacgm_testkit.otlp_store import serve  # noqa: E402
from probe_overhead import agent_command, build_loop, find_libraries  # noqa: E402

# The target: maps both libraries, says so, then forks FORKS children on each line of stdin
# (each exits at once) and prints the median fork+wait time in microseconds.
TARGET = """import ctypes, json, os, statistics, sys, time
ctypes.CDLL(sys.argv[1]); ctypes.CDLL(sys.argv[2])
print("ready", flush=True)
for line in sys.stdin:
    times = []
    for _ in range(int(line)):
        t0 = time.perf_counter_ns()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        times.append((time.perf_counter_ns() - t0) / 1e3)
    print(json.dumps({"fork_us": statistics.median(times)}), flush=True)
"""

MODES = ("untraced", "scoped", "file-wide")


class Agent:
    """The agent tracing `pid`, with probes scoped or file-wide; ready once its probes are linked."""

    def __init__(self, endpoint: str, pid: int, scoped: bool) -> None:
        env = dict(os.environ, OTEL_EACGM_SCOPED_PROBES=str(scoped).lower(), OTEL_EACGM_STATS_LOG_INTERVAL_S="0",
                   OTEL_EACGM_LOG_LEVEL="info", OTEL_EACGM_CALL_METRICS="false")
        self.proc = subprocess.Popen([*agent_command(endpoint), "--pid", str(pid)], stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stderr.readline, "")), daemon=True).start()
        deadline = time.monotonic() + 120
        while not any(" ready: " in line for line in self.lines):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit("agent not ready:\n" + "".join(self.lines)[-3000:])
            time.sleep(0.05)
        if not any("libnccl" in line and "attached" in line for line in self.lines):
            raise SystemExit("agent attached nothing to libnccl:\n" + "".join(self.lines)[-3000:])

    def stop(self) -> str:
        self.proc.terminate()
        self.proc.wait(120)
        return "".join(self.lines)


def neighbour(loop: list[str]) -> dict:
    return json.loads(subprocess.run(loop, capture_output=True, text=True, check=True).stdout.strip())


def forks(target: subprocess.Popen, n: int) -> float:
    assert target.stdin is not None and target.stdout is not None
    target.stdin.write(f"{n}\n")
    target.stdin.flush()
    return json.loads(target.stdout.readline())["fork_us"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=200000)
    ap.add_argument("--forks", type=int, default=30)
    args = ap.parse_args()
    server, _store, port = serve()
    endpoint = f"http://127.0.0.1:{port}"
    rt, nccl = find_libraries()
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        loop = [str(build_loop(Path(tmp))), rt, nccl, str(args.iterations)]
        target = subprocess.Popen([sys.executable, "-c", TARGET, rt, nccl], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert target.stdout is not None and target.stdout.readline().strip() == "ready"
        try:
            for r in range(args.rounds):
                for mode in MODES[r % 3:] + MODES[:r % 3]:
                    agent = Agent(endpoint, target.pid, mode == "scoped") if mode != "untraced" else None
                    try:
                        result = neighbour(loop)
                        result["fork_us"] = forks(target, args.forks)
                    finally:
                        if agent is not None:
                            agent.stop()
                    results[mode].append(result)
                    print(f"round {r} {mode}: {result}", file=sys.stderr, flush=True)
        finally:
            target.kill()
    server.stop(0)
    print(f"# the neighbour's call cost: {args.rounds} interleaved rounds of {args.iterations} iterations, medians")
    print("| neighbour's call | untraced ns/call | scoped probes ns/call (ratio) | file-wide probes ns/call (ratio) |")
    print("|---|---|---|---|")
    for key, label in (("launch_ns", "cudaLaunchKernel (entry probe)"),
                       ("group_pair_ns", "ncclGroupStart+End (2 x entry+return)")):
        base = statistics.median(x[key] for x in results["untraced"])
        cells = [f"{(v := statistics.median(x[key] for x in results[m])):.1f} ({v / base:.2f}x)" for m in MODES[1:]]
        print(f"| {label} | {base:.1f} | {' | '.join(cells)} |")
    print()
    print(f"# the traced process's fork+wait ({args.forks} forks a round; median of round medians)")
    print("| untraced us | scoped probes us (children held until linked) | file-wide probes us |")
    print("|---|---|---|")
    print("| " + " | ".join(f"{statistics.median(x['fork_us'] for x in results[m]):.0f}" for m in MODES) + " |")


if __name__ == "__main__":
    main()
