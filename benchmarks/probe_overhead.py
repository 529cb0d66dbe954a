"""Probe cost and sustained capture rate of `otel-eacgm agent`, side by side in one run.

Part 1, per-call cost: a C loop (benchmarks/call_loop.c) calls cudaLaunchKernel (entry-only
probe) and ncclGroupStart+ncclGroupEnd (entry+return probes) from the real wheel libraries,
alternately untraced and under the agent, ROUNDS times; medians and the added ns per call.
The ring buffer is sized so that no record is dropped (a dropped record is cheaper and would
flatter the figure).
Part 2, sustained capture: the launch loop paced at increasing rates for 4 s each; the agent
must capture every call with zero ring-buffer drops. Spans go to an in-process OTLP store.

usage: probe_overhead.py [--rounds 5] [--iterations 20000] [--rates 5000,10000,20000,40000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from eacgm_testkit.otlp_store import serve  # noqa: E402


def find_libraries() -> tuple[str, str]:
    """libcudart and libnccl from the nvidia wheels of this Python (layouts differ by version)."""
    found: dict[str, str] = {}
    for entry in sys.path:
        for pattern, key in (("nvidia/**/libcudart.so.1[0-9]", "cudart"), ("nvidia/**/libnccl.so.2", "nccl")):
            for path in sorted(Path(entry or ".").glob(pattern)) if Path(entry or ".", "nvidia").is_dir() else []:
                found.setdefault(key, str(path))
    if len(found) != 2:
        raise SystemExit(f"need the nvidia-cuda-runtime and nvidia-nccl wheels; found {found}")
    return found["cudart"], found["nccl"]


def build_loop(out_dir: Path) -> Path:
    """Compile call_loop.c (or use $EACGM_CALL_LOOP when the machine has no compiler)."""
    prebuilt = os.environ.get("EACGM_CALL_LOOP")
    if prebuilt:
        return Path(prebuilt)
    if shutil.which("gcc") is None:
        raise SystemExit("gcc is needed to build benchmarks/call_loop.c (or set EACGM_CALL_LOOP)")
    binary = out_dir / "call_loop"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(REPO / "benchmarks/call_loop.c"), "-ldl"], check=True)
    return binary


def agent_command(endpoint: str) -> list[str]:
    """The agent as installed in .venv, or run from the source tree."""
    exe = REPO / ".venv/bin/otel-eacgm"
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "otel_eacgm.cli"]
    return [*base, "agent", "--endpoint", endpoint, "--insecure", "--launch-layer", "cuda.runtime",
            "--layers", "cuda.runtime,nccl"]


def traced(endpoint: str, loop: list[str], pages: int) -> tuple[dict, dict[str, int], str]:
    env = dict(os.environ, OTEL_EACGM_RINGBUF_PAGES=str(pages), OTEL_EACGM_STATS_LOG_INTERVAL_S="0",
               OTEL_EACGM_LOG_LEVEL="info")
    proc = subprocess.run([*agent_command(endpoint), "--", *loop], capture_output=True, text=True, env=env, check=False)
    done = [line for line in proc.stderr.splitlines() if " done: " in line]
    if proc.returncode != 0 or not done:
        raise SystemExit(f"agent run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    counters = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", done[-1].split(" done: ", 1)[1])}
    return json.loads(proc.stdout.strip().splitlines()[-1]), counters, proc.stderr


def untraced(loop: list[str]) -> dict:
    return json.loads(subprocess.run(loop, capture_output=True, text=True, check=True).stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=20000)
    ap.add_argument("--rates", default="5000,10000,20000,40000")
    args = ap.parse_args()
    server, store, port = serve()
    endpoint = f"http://127.0.0.1:{port}"
    rt, nccl = find_libraries()
    with tempfile.TemporaryDirectory() as tmp:
        binary = str(build_loop(Path(tmp)))
        loop = [binary, rt, nccl, str(args.iterations)]
        base, probed = [], []
        for r in range(args.rounds):
            base.append(untraced(loop))
            result, counters, _ = traced(endpoint, loop, pages=16384)
            expected = 1 + 3 * args.iterations  # warm-up launch + launches + start/end pairs
            if counters["dropped_ringbuf"] or counters["calls"] != expected:
                raise SystemExit(f"round {r}: captured {counters['calls']} of {expected}, drops {counters['dropped_ringbuf']}")
            probed.append(result)
        print(f"# per-call cost, {args.rounds} interleaved rounds of {args.iterations} iterations, medians")
        print("| call | probes | untraced ns/call | traced ns/call | added ns/call | ratio |")
        print("|---|---|---|---|---|---|")
        for key, label, probes in (("launch_ns", "cudaLaunchKernel", "uprobe"),
                                   ("group_pair_ns", "ncclGroupStart+End (2 calls)", "2 x (uprobe+uretprobe)")):
            b = statistics.median(x[key] for x in base)
            t = statistics.median(x[key] for x in probed)
            print(f"| {label} | {probes} | {b:.1f} | {t:.1f} | {t - b:.1f} | {t / b:.1f}x |")
        print()
        print("# sustained capture (paced cudaLaunchKernel loop, 4 s per rate, ring buffer 1024 pages)")
        print("| target calls/s | achieved calls/s | captured | exported | ring-buffer drops | export-queue drops |")
        print("|---|---|---|---|---|---|")
        for rate in (float(x) for x in args.rates.split(",")):
            n = int(rate * 4)
            result, counters, _ = traced(endpoint, [binary, rt, nccl, str(n), str(rate)], pages=1024)
            achieved = 1e9 / result["launch_ns"]
            print(f"| {rate:.0f} | {achieved:.0f} | {counters['calls']} | {counters['exported']} | "
                  f"{counters['dropped_ringbuf']} | {counters['dropped_export']} |")
    server.stop(0)


if __name__ == "__main__":
    main()
