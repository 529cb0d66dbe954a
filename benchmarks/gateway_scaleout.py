"""Throughput of the detector behind the gateway's loadbalancing exporter: 1 replica vs 3.

The stack of tests/scaleout/ (simulated agents of 12 entities on 6 hosts -> gateway collector,
loadbalancing by entity -> N `detector serve` replicas -> backends collector -> OTLP store),
with the agents sending as fast as the gateway takes them. Each run times from the agents' start
to the replicas' last output before they are stopped (the store's last arrival); spans/s is the
spans the agents sent over that time, windows/s the windows scored in it. Runs alternate 1 and 3
replicas; medians and the 3:1 ratio are printed. A replica is one Python process (one scoring
thread): on a machine with fewer free cores than replicas the ratio says more about the cores
than about the exporter.

    .venv/bin/python benchmarks/gateway_scaleout.py [--repeats 3] [--windows 130]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests/e2e"), str(REPO / "tests/scaleout")]

from scaleout_stack import scaleout  # noqa: E402


def one_run(n_replicas: int, windows: int, log_dir: Path) -> tuple[float, float, float]:
    """(seconds, spans/s, windows/s) of one run with n_replicas."""
    with scaleout(log_dir, n_replicas) as stack:
        t0 = time.monotonic()
        stack.run_agents(windows, pace_s=0.0)
        last = stack.flush()
        seconds = last - t0
        scored = sum(1 for p in stack.store.metric_points() if p["name"] == "eacgm.anomaly.score")
    return seconds, stack.sent["spans"] / seconds, scored / seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--windows", type=int, default=130, help="1 s windows each simulated process sends")
    args = ap.parse_args()
    figures: dict[int, list[tuple[float, float, float]]] = {1: [], 3: []}
    with tempfile.TemporaryDirectory(prefix="eacgm-gateway-bench-") as tmp:
        for i in range(args.repeats):
            for n in (1, 3):
                log_dir = Path(tmp) / f"{n}-{i}"
                log_dir.mkdir()
                figures[n].append(one_run(n, args.windows, log_dir))
                s, sps, wps = figures[n][-1]
                print(f"run {i + 1}, {n} replica(s): {s:.1f} s, {sps:,.0f} spans/s, {wps:,.1f} windows/s", flush=True)
    print(f"\n{os.cpu_count()} CPUs; 12 entities x {args.windows} windows; medians of {args.repeats} runs\n")
    print("| replicas | seconds | spans/s | windows/s |\n|---|---|---|---|")
    med = {n: [statistics.median(f[k] for f in figures[n]) for k in range(3)] for n in (1, 3)}
    for n in (1, 3):
        print(f"| {n} | {med[n][0]:.1f} | {med[n][1]:,.0f} | {med[n][2]:,.1f} |")
    print(f"| 3 : 1 | {med[3][0] / med[1][0]:.2f} | {med[3][1] / med[1][1]:.2f} | {med[3][2] / med[1][2]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
