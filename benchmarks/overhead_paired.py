"""Paired overhead: one agent stays up and pauses its probes in alternating blocks; steps inside
traced blocks are compared with steps inside the paused blocks next to them.

Back-to-back A/B runs could not resolve the 5 % budget: the GPU host's own step time moved 13 %
between 8-second blocks, and an agent start takes 8-10 s (issue 27). Here the agent runs with
``pause_cycle_s`` (otel_eacgm/pause_cycle.py): every ``--block-s`` it detaches or re-attaches
every probe through the same probe links the guardrail cycles, and logs each switch with its
CLOCK_MONOTONIC bounds. The workload process (benchmarks/workload.py) reports each step's
bounds on the same clock. A step that overlaps a switch is dropped; each paused block is paired
with the mean of the medians of the traced blocks before and after it (a drift that is linear
over three blocks cancels), and the pair's ratio is traced / paused. Reported per workload and
configuration: the median and the geometric mean of the pair ratios with a 95 % bootstrap
interval (pairs resampled), the guardrail's decisions, and the agent's counters.

Configurations: ``guardrail_off`` (overhead_budget 0: every probe attached in traced blocks) and
``guardrail_on`` (the default 5 % budget). The guardrail's clock leaves the paused blocks out,
so it keeps the duty it chose across them.

usage: overhead_paired.py --out DIR [--python P] [--workloads tiny,gpt_launch] [--seconds 60]
       [--block-s 1.5] [workload.py options, e.g. --preset cpu-smoke]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from agent_session import ALL_LAYERS, Agent, markdown_table, med, wait_gone  # noqa: E402
from overhead_ab import Workload  # noqa: E402

from eacgm_testkit.otlp_store import serve  # noqa: E402

CONFIGS = {"guardrail_off": {"OTEL_EACGM_OVERHEAD_BUDGET": "0"}, "guardrail_on": {}}
MIN_BLOCK_STEPS = 3  # steps a block needs for its median to count
BOOTSTRAP = 2000


def blocks_of(bounds: list[list[int]], switches: list[dict]) -> list[tuple[str, list[float]]]:
    """Steps (ms) grouped by the block they lie in, in time order: ("traced" | "paused", steps).
    Block k lies between switch k-1's end and switch k's start; a step overlapping a switch, or
    in no block, is dropped."""
    edges = [(-math.inf, "traced")] + [(s["end_ns"], s["state"]) for s in switches]
    out: list[tuple[str, list[float]]] = [(state, []) for _, state in edges]
    for start, end in bounds:
        for k, (begin, state) in enumerate(edges):
            until = switches[k]["start_ns"] if k < len(switches) else math.inf
            if begin <= start and end <= until:
                out[k][1].append((end - start) / 1e6)
                break
    return out


def pair_ratios(blocks: list[tuple[str, list[float]]]) -> list[float]:
    """Per paused block with enough steps: mean of its traced neighbours' medians / its median."""
    ratios = []
    for k, (state, steps) in enumerate(blocks):
        if state != "paused" or len(steps) < MIN_BLOCK_STEPS:
            continue
        around = [statistics.median(blocks[j][1]) for j in (k - 1, k + 1)
                  if 0 <= j < len(blocks) and blocks[j][0] == "traced" and len(blocks[j][1]) >= MIN_BLOCK_STEPS]
        if around:
            ratios.append(statistics.fmean(around) / statistics.median(steps))
    return ratios


def geo_mean_ci(ratios: list[float], seed: int = 0) -> tuple[float, float, float]:
    """Geometric mean of the ratios and its 95 % bootstrap interval (pairs resampled)."""
    logs = [math.log(r) for r in ratios]
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(BOOTSTRAP))
    return (math.exp(statistics.fmean(logs)), math.exp(means[int(0.025 * BOOTSTRAP)]),
            math.exp(means[int(0.975 * BOOTSTRAP) - 1]))


def run(work: Workload, workload: str, config: str, args: argparse.Namespace, endpoint: str) -> dict:
    """One agent on the workload process for `args.seconds` of steps in alternating blocks."""
    log = args.out / f"pauses-{workload}-{config}.jsonl"
    log.unlink(missing_ok=True)
    env = {"OTEL_EACGM_PAUSE_CYCLE_S": str(args.block_s), "OTEL_EACGM_PAUSE_CYCLE_LOG": str(log), **CONFIGS[config]}
    agent = Agent(["--pid", str(work.proc.pid), "--endpoint", endpoint, "--insecure", "--layers", args.layers],
                  args.out / f"agent-{workload}-{config}.log", env).start(args.agent_timeout)
    step_ms = work.step_ms[workload]
    work.block(workload, max(1, round(args.settle_s * 1e3 / step_ms)))  # the guardrail settles (traced time)
    cpu0 = agent.usage()
    bounds: list[list[int]] = []
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        bounds += work.block(workload, max(1, round(2.0 * 1e3 / step_ms)))["bounds_ns"]
    cpu1 = agent.usage()
    stopped = agent.stop()
    wait_gone(stopped["release_pid"], args.release_timeout)
    switches = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    # whole lines: the duty is at the end of a decision, past what Agent.stop keeps of each
    decisions = [ln.split("guardrail: ", 1)[1] for ln in agent.log_path.read_text(errors="replace").splitlines()
                 if "guardrail: " in ln]
    blocks = blocks_of(bounds, switches)
    ratios = pair_ratios(blocks)
    row = {"workload": workload, "config": config, "steps": len(bounds), "pairs": len(ratios),
           "traced_steps": sum(len(s) for st, s in blocks if st == "traced"),
           "paused_steps": sum(len(s) for st, s in blocks if st == "paused"),
           "median_traced_ms": med([x for st, s in blocks if st == "traced" for x in s]),
           "median_paused_ms": med([x for st, s in blocks if st == "paused" for x in s]),
           "ratios": ratios, "switches": len(switches), "guardrail": decisions, "done": stopped["done"],
           "agent_cpu_share": (cpu1[0] - cpu0[0]) / args.seconds if cpu0 and cpu1 else None}
    if len(ratios) >= 3:
        row["median_ratio"] = statistics.median(ratios)
        row["geo_mean_ratio"], row["ci_low"], row["ci_high"] = geo_mean_ci(ratios)
    print(f"  {workload} {config}: {row['pairs']} pairs, median ratio {row.get('median_ratio')}, "
          f"geo-mean {row.get('geo_mean_ratio')} [{row.get('ci_low')}, {row.get('ci_high')}]", flush=True)
    return row


def last_duty(guardrail_lines: list[str]) -> float:
    """The share of the time the cycled probes were attached at the end: the guardrail's last
    decision ("attached 12% of each 2 s", or "attached all the time" once within the budget)."""
    for line in reversed(guardrail_lines):
        if m := re.search(r"attached (\d+)% of each", line):
            return int(m.group(1)) / 100
        if "attached all the time" in line:
            return 1.0
    return 1.0


def report(rows: list[dict]) -> str:
    def f(v: float | None, d: int = 3) -> str:
        return "-" if v is None else f"{v:.{d}f}"
    table = markdown_table(
        ["workload", "config", "pairs", "steps traced / paused", "median step ms traced / paused",
         "pair ratio median", "geo-mean ratio [95% CI]", "agent CPU", "cycled probes' duty at the end"],
        [[r["workload"], r["config"], r["pairs"], f"{r['traced_steps']} / {r['paused_steps']}",
          f"{f(r['median_traced_ms'], 2)} / {f(r['median_paused_ms'], 2)}", f(r.get("median_ratio")),
          f"{f(r.get('geo_mean_ratio'))} [{f(r.get('ci_low'))}, {f(r.get('ci_high'))}]",
          f"{100 * r['agent_cpu_share']:.0f}%" if r["agent_cpu_share"] is not None else "-",
          f"{100 * last_duty(r['guardrail']):.0f}%"] for r in rows])
    counters = markdown_table(
        ["workload", "config", "calls", "unmatched_returns", "cycled_returns", "dropped_ringbuf", "dropped_export"],
        [[r["workload"], r["config"], *(r["done"].get(k) for k in ("calls", "unmatched_returns", "cycled_returns",
                                                                      "dropped_ringbuf", "dropped_export"))]
         for r in rows])
    return table + "\n\n" + counters + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--python", default=sys.executable, help="interpreter of the workload")
    ap.add_argument("--workloads", default="tiny,gpt_launch")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--seconds", type=float, default=60.0, help="measured seconds per workload and configuration")
    ap.add_argument("--block-s", type=float, default=1.5, help="seconds per traced or paused block")
    ap.add_argument("--settle-s", type=float, default=6.0, help="steps before measuring (the guardrail reacts)")
    ap.add_argument("--layers", default=ALL_LAYERS)
    ap.add_argument("--agent-timeout", type=float, default=300)
    ap.add_argument("--release-timeout", type=float, default=60)
    args, extra = ap.parse_known_args()
    args.out.mkdir(parents=True, exist_ok=True)
    server, store, port = serve()
    work = Workload(args.python, extra, args.out / "workload.log")
    rows = []
    try:
        for workload in args.workloads.split(","):
            for config in args.configs.split(","):
                rows.append(run(work, workload, config, args, f"http://127.0.0.1:{port}"))
                with store._lock:  # noqa: SLF001 - the spans are not analysed here: memory stays flat
                    store.traces, store.metrics, store.logs = [], [], []
                (args.out / "overhead_paired.json").write_text(json.dumps(
                    {"args": {k: str(v) for k, v in vars(args).items()}, "workload": work.info, "rows": rows}, indent=1))
    finally:
        work.quit()
        server.stop(0)
    text = report(rows)
    (args.out / "overhead_paired.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
