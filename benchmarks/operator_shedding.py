"""What shedding a high-rate tiny operator gives back: the rate of a loop of tiny in-place adds
(tests/workloads/torch_tiny_ops.py, a 96x96 product every 100 adds) untraced, under the agent
with shedding off (torch_shed_share 0) and on (the default), side by side, ROUNDS times each;
medians of adds per second and the loop's slowdown against untraced. Spans go nowhere (the
`trace` command into a scratch Perfetto file would hold every span; here OTLP to a closed port,
spans sampled at 0): what is measured is the probes' cost.

usage: sudo .venv/bin/python benchmarks/operator_shedding.py [--rounds 3] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKLOAD = str(REPO / "tests/workloads/torch_tiny_ops.py")
AGENT = [str(REPO / ".venv/bin/otel-eacgm"), "agent", "--endpoint", "http://127.0.0.1:9", "--insecure",
         "--layers", "torch", "--sample-ratio", "0"]


def rate(cmd: list[str], seconds: float, env: dict[str, str]) -> float:
    """Adds per second the workload made under `cmd` (empty: untraced)."""
    out = subprocess.run([*cmd, sys.executable, WORKLOAD, str(seconds)], capture_output=True, text=True,
                         env=env, timeout=120 + 4 * seconds, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["adds"] / seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {
        "OTEL_EACGM_GPU_METRICS": "0", "OTEL_EACGM_OVERHEAD_BUDGET": "0", "OTEL_EACGM_EXPORT_TIMEOUT_S": "1"}
    configs = {"untraced": ([], env), "shedding off": ([*AGENT, "--"], env | {"OTEL_EACGM_TORCH_SHED_SHARE": "0"}),
               "shedding on": ([*AGENT, "--"], env)}
    rates: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, (cmd, cfg_env) in configs.items():
            rates[name].append(rate(cmd, args.seconds, cfg_env))
    base = statistics.median(rates["untraced"])
    print(f"tiny in-place adds, {args.seconds:g} s runs, median of {args.rounds} rounds (adds/s; per-run figures)")
    for name, values in rates.items():
        med = statistics.median(values)
        print(f"  {name:13} {med:10.0f} adds/s  {med / base:6.2f}x untraced   "
              + " ".join(f"{v:.0f}" for v in values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
