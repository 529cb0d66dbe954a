"""Interleaved A/B overhead of `otel-eacgm agent` and torch.profiler on real PyTorch workloads.

One long-lived workload process (benchmarks/workload.py: GPT-2-small training step GPU-bound
and launch-bound, a loop of tiny kernels, an inference loop; each step ends with a
world-size-1 NCCL all-reduce, gloo on CPU) runs blocks of steps on command. Each round runs
every configuration once, in an order rotated from round to round:

* ``untraced``;
* ``agent_default``: `otel-eacgm agent --pid W --layers cuda.runtime,cuda.driver,nccl,torch,python`
  with every other setting at its default (span sampling 0.1, NVML + network metrics on, the
  overhead guardrail at its 5% budget);
* ``agent_full``: the same with ``OTEL_EACGM_SPAN_SAMPLE_RATIO=1`` and the guardrail off (every
  call a span: the raw cost of every probe);
* ``profiler``: the block under ``torch.profiler.profile`` (CPU + CUDA activities), in-process.

An agent configuration attaches to the running workload (it logs ``ready:`` once its probes
are in), runs ``--settle-s`` of unmeasured steps and then one measured block of every workload
(blocks are sized by time, ``--block-s``), and is stopped; the next configuration starts only
after the agent's background probe release has finished, so no block is measured beside
leftover probes. Spans and metrics go to the package's OTLP store in this process; the calls
and launches per step of each block come from ``agent_full``'s in-kernel call statistics, and
the spans per layer from its spans (by span start time). The agent's CPU time and RSS come from /proc between the block's start and end;
its `done:` line gives captured calls and drops. The first ``--skip-steps`` of each block are
not counted. The guardrail's extrapolation is checked against the truth: agent_default's
launch count from its call statistics (extrapolated while cycled) against agent_full's (every
launch counted in the kernel) over the same steps of the same round. Results:
``OUT/overhead_ab.json`` and ``OUT/overhead_ab.md`` (printed too); ``--merge`` analyses the
results of several runs together.

    sudo $P benchmarks/overhead_ab.py --quick --out results/overhead            # H200, ~5 min
    sudo $P benchmarks/overhead_ab.py --out results/overhead                    # 3 rounds, longer blocks
    sudo .venv/bin/python benchmarks/overhead_ab.py --quick --out /tmp/ab --device cpu --preset cpu-smoke

Unknown flags go to the workload (``--device``, ``--dtype``, ``--preset``, sizes: see
``python benchmarks/workload.py --help``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from agent_session import ALL_LAYERS, Agent, agent_processes, markdown_table, med, wait_gone  # noqa: E402
from otel_eacgm.guardrail import unit_of  # noqa: E402
from eacgm_testkit.otlp_store import serve  # noqa: E402
from otel_eacgm.probes.catalog import CATALOG, Layer  # noqa: E402

CONFIGS = ("untraced", "agent_default", "agent_full", "profiler")
WORKLOADS = ("gpt_gpu", "gpt_launch", "tiny", "infer")
QUICK_BLOCK_S, FULL_BLOCK_S = 4.0, 8.0  # measured seconds per block (steps sized from the warm-up step time)
MIN_STEPS = 10
COUNT_EXPORT_S, COUNT_GAP_S = 1.0, 2.5  # agent_full's metric interval, and its idle gap between workloads
TARGETS = {"gpt_gpu": 1.005, "gpt_launch": 1.15}  # issue 7, agent at default settings
REFERENCE = ("issue 7 reference (H200): GPU-bound step 141 ms, torch.profiler 1.011x; "
             "launch-bound step 29 ms (~800 launches), torch.profiler 1.61x")
PENDING_RELEASES: list[int] = []  # release children still running after --release-timeout
LAUNCH_NAMES = ("cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernel", "cudaLaunchKernelExC")


class Workload:
    """The workload process and its line protocol."""

    def __init__(self, python: str, extra: list[str], log: Path) -> None:
        self._log = open(log, "wb")  # noqa: SIM115 - closed in quit()
        self.proc = subprocess.Popen([python, str(REPO / "benchmarks/workload.py"), *extra], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1)
        self.info = self._read()
        #: one step's wall ms per workload, from the last warm-up step (sizes blocks by time)
        self.step_ms = {name: times[-1] for name, times in self.info["warmup_ms"].items()}

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"workload exited ({self.proc.wait()}); see {self._log.name}")

    def block(self, workload: str, steps: int, profiler: bool = False) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": "block", "workload": workload, "steps": steps,
                                          "profiler": profiler}) + "\n")
        return self._read()

    def quit(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write('{"cmd": "quit"}\n')
        self.proc.stdin.close()
        self.proc.wait(60)
        self._log.close()


def span_counts(store, blocks: list[dict]) -> None:
    """Per block (by span start in [t0, t1]): spans, launches and spans per layer; store emptied."""
    for b in blocks:
        b["spans"], b["launches"], b["by_layer"] = 0, 0, collections.Counter()
    with store._lock:  # noqa: SLF001 - read once, then dropped: memory stays one attach's worth
        requests, store.traces, store.metrics, store.logs = store.traces, [], [], []
    for req in requests:
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    b = next((b for b in blocks if b["t0_ns"] <= s.start_time_unix_nano <= b["t1_ns"]), None)
                    if b is None:
                        continue
                    layer = next((a.value.string_value for a in s.attributes if a.key == "eacgm.layer"), "?")
                    b["spans"] += 1
                    b["by_layer"][layer] += 1
                    b["launches"] += s.name in LAUNCH_NAMES
    for b in blocks:
        b["by_layer"] = dict(b["by_layer"])


def run_config(cfg: str, rnd: int, work: Workload, args: argparse.Namespace, endpoint: str, store) -> tuple[list, dict]:
    """One configuration's block of every workload; with an agent, attach before and detach after."""
    agent, attach = None, {"round": rnd, "config": cfg}
    if cfg.startswith("agent"):
        env = dict(kv.split("=", 1) for kv in args.agent_env)
        if cfg == "agent_full":  # every call a span, no guardrail: the raw cost of every probe
            env.update(OTEL_EACGM_SPAN_SAMPLE_RATIO="1", OTEL_EACGM_OVERHEAD_BUDGET="0",
                       OTEL_EACGM_METRICS_INTERVAL_S=str(COUNT_EXPORT_S))
        agent = Agent(["--pid", str(work.proc.pid), "--endpoint", endpoint, "--insecure", "--layers", args.layers],
                      args.out / f"agent-r{rnd}-{cfg}.log", env).start(args.agent_timeout)
        attach["ready_s"], attach["ready"] = round(agent.ready_s, 2), agent.ready_line.split(" ready: ", 1)[-1]
        attach["cpu_at_ready_s"] = agent.usage()[0]
    blocks = []
    for name in args.workloads:
        leftover = [pid for pid in PENDING_RELEASES if os.path.exists(f"/proc/{pid}")]
        if cfg == "agent_full":  # an idle gap holding one export of the call counts (see kernel_counts)
            time.sleep(COUNT_GAP_S)
        settle = []
        if agent and args.settle_s > 0:  # a long job's steady state: the guardrail has reacted
            settle = work.block(name, max(1, round(args.settle_s * 1e3 / work.step_ms[name])))["times_ms"]
        before = agent.usage() if agent else None
        r = work.block(name, args.steps[name], profiler=cfg == "profiler")
        after = agent.usage() if agent else None
        used = r["times_ms"][args.skip_steps:]
        b = {"round": rnd, "config": cfg, "workload": name, "times_ms": r["times_ms"], "steps": len(r["times_ms"]),
             "median_ms": med(used), "throughput_steps_s": len(used) / (sum(used) / 1e3),
             "t0_ns": r["t0_ns"], "t1_ns": r["t1_ns"], "wall_s": (r["t1_ns"] - r["t0_ns"]) / 1e9,
             "leftover_probes": bool(leftover), "settle_ms": settle}
        if before and after:
            b.update(agent_cpu_s=after[0] - before[0], agent_rss_mib=after[1], agent_peak_rss_mib=after[2])
        blocks.append(b)
    if agent:
        attach["cpu_before_stop_s"] = (agent.usage() or (None,))[0]
        attach.update(agent.stop())
        attach["release_wait_s"], attach["released"] = wait_gone(attach["release_pid"], args.release_timeout)
        if not attach["released"]:
            PENDING_RELEASES.append(attach["release_pid"])
            print(f"warning: probe release of round {rnd} {cfg} not done after {args.release_timeout:.0f} s; "
                  "the next blocks run beside leftover probes", file=sys.stderr)
        series = call_series(store, agent.pid, work.proc.pid)  # before span_counts empties the store
        attach["launches_counted"] = launch_total(series)
        if cfg == "agent_full":
            kernel_counts(series, blocks)
            span_counts(store, blocks)
        else:
            span_counts(store, [])
        d = attach["done"]
        print(f"  round {rnd} {cfg}: ready {attach['ready_s']} s, calls={d.get('calls')} "
              f"dropped_ringbuf={d.get('dropped_ringbuf')} dropped_export={d.get('dropped_export')}, "
              f"stop {attach['stop_s']} s, release {attach['release_wait_s']:.1f} s", flush=True)
    return blocks, attach


def call_series(store, agent_pid: int, workload_pid: int) -> dict[tuple, list[tuple[int, float]]]:  # noqa: ANN001
    """The agent's cumulative eacgm.calls points about the workload: per series (its sorted
    attributes), (time, value) in time order. The points come under the workload's resource
    (since issue 28; under the agent's before), so either resource pid is taken."""
    series: dict[tuple, list[tuple[int, float]]] = collections.defaultdict(list)
    for p in store.metric_points():
        a = p["attributes"]
        if p["name"] == "eacgm.calls" and p["resource"].get("process.pid") in (agent_pid, workload_pid) and \
                a.get("process.pid") == workload_pid:
            series[tuple(sorted((k, str(v)) for k, v in a.items()))].append((p["time"], p["value"]))
    for pts in series.values():
        pts.sort()
    return series


def is_launch(key: tuple) -> bool:
    return any(("code.function.name", n) in key for n in LAUNCH_NAMES)


def kernel_counts(series: dict[tuple, list[tuple[int, float]]], blocks: list[dict]) -> None:
    """Per block: calls and launches of its settle and measured steps, and calls per step of
    each function, from agent_full's in-kernel call statistics (exact, unlike its spans, which
    the ring buffer drops at 100%). The workload idles for COUNT_GAP_S before each workload's
    steps, so an export of the cumulative counts falls between any two workloads' steps: the
    block's calls are the last total exported before its steps began subtracted from the first
    one read after they ended (an exported total is up to half an interval old, hence
    "exported an interval after")."""

    def value(pts: list[tuple[int, float]], at_ns: int, after: bool) -> float:
        chosen = [v for t, v in pts if t >= at_ns] if after else [v for t, v in pts if t <= at_ns]
        return (chosen[0] if after else chosen[-1]) if chosen else (pts[-1][1] if after else 0.0)

    for b in blocks:
        start = b["t0_ns"] - int(sum(b["settle_ms"]) * 1e6)
        steps = b["steps"] + len(b["settle_ms"])
        end = b["t1_ns"] + int(COUNT_EXPORT_S * 1e9)
        per_key = {key: (value(pts, end, True) - value(pts, start, False)) / steps for key, pts in series.items()}
        b["kernel_calls_per_step"] = sum(per_key.values())
        b["kernel_launches_per_step"] = sum(v for key, v in per_key.items() if is_launch(key))
        by_function: dict[str, float] = collections.Counter()
        for key, v in per_key.items():
            a = dict(key)
            by_function[f"{a.get('eacgm.layer')} {a.get('code.function.name')}"] += v
        b["kernel_calls_by_function"] = {k: round(v, 2) for k, v in by_function.items() if v > 0}


def cycled_by_guardrail(function: str) -> bool:
    """Whether the guardrail (with probe links) duty-cycles a "<layer> <symbol>" of the call
    statistics: every PyTorch operator, and the catalog rows its rule says."""
    layer, symbol = function.split(" ", 1)
    if layer == Layer.TORCH.value:
        return True
    return unit_of(next((s for s in CATALOG if s.symbol == symbol), None), multi_links=True) is not None


def uncycled_calls(blocks: list[dict], workloads: list[str], top: int = 12) -> list[list]:
    """Per workload, agent_full's calls per step (median over rounds) of the functions the
    guardrail cannot cycle, most frequent first: with probe hits of several microseconds, these
    bound what a duty cycle can save."""
    rows = []
    for w in workloads:
        counted = [b["kernel_calls_by_function"] for b in blocks
                   if b["workload"] == w and b["config"] == "agent_full" and b.get("kernel_calls_by_function")]
        functions = {f for c in counted for f in c if not cycled_by_guardrail(f)}
        per_step = sorted(((med([c.get(f, 0.0) for c in counted]), f) for f in functions), reverse=True)
        rows += [[w, f, round(n, 1)] for n, f in per_step[:top] if n > 0]
    return rows


def launch_total(series: dict[tuple, list[tuple[int, float]]]) -> int:
    """Launches the agent's call statistics counted over the agent's life (the last cumulative
    points; extrapolated where the guardrail cycled the probes)."""
    return round(sum(max(v for _, v in pts) for key, pts in series.items() if is_launch(key)))


def extrapolation_error(attaches: list[dict]) -> dict | None:
    """agent_default's launch count (guardrail on, extrapolated) against agent_full's (guardrail
    off, every launch counted in the kernel) of the same round: both ran the same steps."""
    full = {a["round"]: a.get("launches_counted") for a in attaches if a["config"] == "agent_full"}
    errs = [a["launches_counted"] / full[a["round"]] - 1 for a in attaches
            if a["config"] == "agent_default" and full.get(a["round"]) and a.get("launches_counted") is not None]
    if not errs:
        return None
    return {"median": med(errs), "min": min(errs), "max": max(errs), "rounds": len(errs)}


def analyse(blocks: list[dict], attaches: list[dict], workloads: list[str], configs: list[str]) -> list[dict]:
    """One row per workload and configuration: medians over rounds and paired ratios to untraced."""
    by = collections.defaultdict(dict)
    for b in blocks:
        by[(b["workload"], b["config"])][b["round"]] = b
    full = {w: [b for b in by[(w, "agent_full")].values() if b.get("spans")] for w in workloads}
    rows = []
    for w in workloads:
        base = by[(w, "untraced")]
        # the in-kernel counts are exact; spans (dropped at 100% when the consumer falls behind) are the fallback
        counted = [b for b in by[(w, "agent_full")].values() if b.get("kernel_calls_per_step")]
        calls = med([b["kernel_calls_per_step"] for b in counted]) if counted else \
            med([b["spans"] / b["steps"] for b in full[w]])
        launches = med([b["kernel_launches_per_step"] for b in counted]) if counted else \
            med([b["launches"] / b["steps"] for b in full[w]])
        for cfg in configs:
            runs = by[(w, cfg)]
            if not runs:
                continue
            ratios = [runs[r]["median_ms"] / base[r]["median_ms"] for r in runs if r in base]
            tput = [runs[r]["throughput_steps_s"] / base[r]["throughput_steps_s"] for r in runs if r in base]
            step = med([b["median_ms"] for b in runs.values()])
            row = {"workload": w, "config": cfg, "rounds": len(runs), "step_ms": step,
                   "step_ms_min": min(b["median_ms"] for b in runs.values()),
                   "step_ms_max": max(b["median_ms"] for b in runs.values()),
                   "ratio": med(ratios), "ratio_min": min(ratios, default=None), "ratio_max": max(ratios, default=None),
                   "ratio_per_round": [round(x, 3) for x in ratios],
                   "throughput_ratio": med(tput), "target": TARGETS.get(w) if cfg == "agent_default" else None}
            if cfg.startswith("agent"):
                base_ms = med([b["median_ms"] for b in base.values()])
                cpu = [b["agent_cpu_s"] for b in runs.values() if "agent_cpu_s" in b]
                row.update(
                    calls_per_step=calls, launches_per_step=launches,
                    probe_hits_per_step_est=None if calls is None else launches + 2 * (calls - launches),
                    added_us_per_call=None if not calls or step is None or base_ms is None
                    else (step - base_ms) * 1e3 / calls,
                    agent_cpu_s_per_step=med([b["agent_cpu_s"] / b["steps"] for b in runs.values() if "agent_cpu_s" in b]),
                    agent_cpu_share=med([b["agent_cpu_s"] / b["wall_s"] for b in runs.values() if "agent_cpu_s" in b]),
                    agent_cpu_s_total=sum(cpu),
                    agent_rss_mib=max((b["agent_rss_mib"] for b in runs.values() if "agent_rss_mib" in b), default=None),
                    events_per_s=med([b["spans"] / b["wall_s"] for b in full[w]]) if cfg == "agent_full" else None)
                ats = [a for a in attaches if a["config"] == cfg]
                row["dropped"] = sum(a["done"].get("dropped_ringbuf", 0) + a["done"].get("dropped_export", 0) for a in ats)
            rows.append(row)
    return rows


def report(rows: list[dict], attaches: list[dict], blocks: list[dict], info: dict, args: argparse.Namespace,
           host: dict | None = None) -> str:
    """The tables; `host` names the machine that ran the blocks (default: this one)."""
    host = host or {"node": platform.node(), "cpus": os.cpu_count()}
    header = ["workload", "config", "step ms (median)", "vs untraced", "per round", "throughput vs untraced", "target",
              "calls/step", "launches/step", "est. probe hits/step", "added us/call", "agent CPU s/step",
              "agent CPU share", "agent RSS MiB", "spans/s (100%)", "drops"]
    table = []
    for r in rows:
        # a duty-cycled step time is bimodal: the target must hold for the median and the mean
        worst = None if r["ratio"] is None or r["throughput_ratio"] is None else max(r["ratio"], 1 / r["throughput_ratio"])
        ok = None if r.get("target") is None or worst is None else \
            f"<= {r['target']} ({'met' if worst <= r['target'] else 'MISSED'})"
        table.append([r["workload"], r["config"], r["step_ms"], r["ratio"],
                      ", ".join(map(str, r.get("ratio_per_round", []))) or None, r["throughput_ratio"], ok,
                      r.get("calls_per_step"), r.get("launches_per_step"), r.get("probe_hits_per_step_est"),
                      r.get("added_us_per_call"), r.get("agent_cpu_s_per_step"), r.get("agent_cpu_share"),
                      r.get("agent_rss_mib"), r.get("events_per_s"), r.get("dropped")])
    att = [[a["round"], a["config"], a.get("ready_s"), a.get("cpu_at_ready_s"), a.get("cpu_before_stop_s"),
            a["done"].get("calls"),
            a["done"].get("received"), a["done"].get("exported"), a["done"].get("dropped_ringbuf"),
            a["done"].get("dropped_export"), a["done"].get("probes"), a["stop_s"], round(a["release_wait_s"], 1),
            a["released"], "; ".join(a.get("guardrail", []))[:300] or "no"] for a in attaches]
    return "\n".join([
        f"# overhead A/B: {args.rounds} interleaved rounds, device {info.get('device')} ({info.get('dtype')}), "
        f"torch {info.get('torch')}, {info.get('params')} parameters, host {host.get('node')} ({host.get('cpus')} CPUs)",
        f"steps per block {args.steps}, first {args.skip_steps} of each block not counted; ratios are medians of "
        "per-round (traced block median / untraced block median)",
        f"sizes {info.get('sizes')}", "",
        markdown_table(header, table), "", REFERENCE, "",
        f"guardrail extrapolation: agent_default launches counted / agent_full's, minus 1: {extrapolation_error(attaches)}",
        "",
        *([f"WARNING: {n} blocks ran while an earlier agent's probes were still being released (see blocks[].leftover_probes)", ""]
          if (n := sum(b["leftover_probes"] for b in blocks)) else []),
        "## calls per step the guardrail cannot cycle (agent_full, in-kernel counts; 2 probe hits each)", "",
        markdown_table(["workload", "layer function", "calls/step"], uncycled_calls(blocks, workloads_of(rows))), "",
        "## agent attaches (drops must be 0)", "",
        markdown_table(["round", "config", "ready s", "CPU s to ready", "CPU s at stop", "calls", "received", "exported",
                        "dropped_ringbuf", "dropped_export", "probes", "stop s", "release wait s", "released",
                        "guardrail throttled"], att),
    ])


def workloads_of(rows: list[dict]) -> list[str]:
    """The workloads of the result rows, in their order."""
    return list(dict.fromkeys(r["workload"] for r in rows))


def merge(dirs: list[Path], out: Path) -> None:
    """Analyse the rounds of several runs together: a device command holds 2 rounds of long
    blocks, so more rounds come from more commands (same workload flags in each)."""
    runs = [json.loads((d / "overhead_ab.json").read_text()) for d in dirs]
    blocks, attaches, offset = [], [], 0
    for run in runs:
        blocks += [{**b, "round": b["round"] + offset} for b in run["blocks"]]
        attaches += [{**a, "round": a["round"] + offset} for a in run["attaches"]]
        offset += run["args"]["rounds"]
    args = argparse.Namespace(**{**runs[0]["args"], "rounds": offset, "out": str(out), "merged": [str(d) for d in dirs]})
    out.mkdir(parents=True, exist_ok=True)
    print(write_result(out, args, runs[0]["workload"], blocks, attaches, runs[0].get("host")))


def write_result(out: Path, args: argparse.Namespace, workload: dict, blocks: list, attaches: list,
                 host: dict | None, **extra) -> str:
    """Analyse the blocks so far and write overhead_ab.json and .md to `out`; returns the report.
    Called after every round, so a command cut short by its time limit keeps its whole rounds."""
    rows = analyse(blocks, attaches, args.workloads, args.configs.split(","))
    text = report(rows, attaches, blocks, workload, args, host)
    result = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "workload": workload, "rows": rows, "extrapolation_error": extrapolation_error(attaches),
              "attaches": attaches, "blocks": blocks, "host": host, **extra}
    (out / "overhead_ab.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "overhead_ab.md").write_text(text + "\n")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="other flags are passed to benchmarks/workload.py")
    ap.add_argument("--out", type=Path, required=True, help="directory for overhead_ab.json/.md and logs")
    ap.add_argument("--quick", action="store_true", help="2 rounds, short blocks (~5 min on the H200)")
    ap.add_argument("--rounds", type=int, help="default 2 with --quick, else 3")
    ap.add_argument("--budget-s", type=float, help="start no round that would end after this many seconds "
                                                   "(default 420 with --quick, else 560: a device command's 10 min)")
    ap.add_argument("--block-s", type=float, help=f"measured seconds per block, steps sized from the warm-up step "
                                                  f"(default {QUICK_BLOCK_S:g} with --quick, else {FULL_BLOCK_S:g})")
    ap.add_argument("--steps", help="fixed steps per block instead, e.g. gpt_gpu=10,tiny=30")
    ap.add_argument("--settle-s", type=float, default=3.0,
                    help="seconds of unmeasured steps before each agent block: a long job's steady state, once "
                         "the guardrail has reacted (its settle step times are kept in the JSON)")
    ap.add_argument("--skip-steps", type=int, default=2, help="first steps of each block not counted")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--layers", default=ALL_LAYERS, help="agent --layers (default: all layers)")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the workload")
    ap.add_argument("--agent-env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra setting for both agent configurations, e.g. OTEL_EACGM_OVERHEAD_BUDGET=0 "
                         "(the overhead guardrail off; repeatable)")
    ap.add_argument("--agent-timeout", type=float, default=300, help="longest wait for the agent's ready line, s")
    ap.add_argument("--release-timeout", type=float, default=150,
                    help="longest wait for the agent's probes to be released before the next block, s")
    ap.add_argument("--merge", nargs="+", type=Path, metavar="DIR",
                    help="run nothing: analyse the overhead_ab.json of these runs' --out directories together")
    args, extra = ap.parse_known_args()
    if args.merge:
        merge(args.merge, args.out)
        return
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.budget_s = args.budget_s or (420 if args.quick else 560)
    args.block_s = args.block_s or (QUICK_BLOCK_S if args.quick else FULL_BLOCK_S)
    fixed_steps = {k: int(v) for k, v in (item.split("=") for item in filter(None, (args.steps or "").split(",")))}
    args.workloads = args.workloads.split(",")
    configs = args.configs.split(",")
    for name in configs:
        if name not in CONFIGS:
            raise SystemExit(f"--configs: {name!r} unknown; expected some of {CONFIGS}")
    if "untraced" not in configs:
        raise SystemExit("--configs must include untraced (the baseline of every ratio)")
    args.out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    others = agent_processes()
    if others:  # e.g. the probe release of a benchmark run just before: it would slow untraced blocks
        print(f"waiting up to {args.release_timeout:.0f} s for other agent processes to exit: {others}", flush=True)
        for pid in others:
            wait_gone(pid, max(0.0, args.release_timeout - (time.monotonic() - t_start)))
        PENDING_RELEASES.extend(pid for pid in others if os.path.exists(f"/proc/{pid}"))
    server, store, port = serve()
    endpoint = f"http://127.0.0.1:{port}"
    work = Workload(args.python, extra, args.out / "workload.log")
    print(f"workload pid {work.proc.pid} ready on {work.info['device']} in {time.monotonic() - t_start:.0f} s; "
          f"warm-up ms {work.info['warmup_ms']}", flush=True)
    args.steps = {name: fixed_steps.get(name, max(MIN_STEPS, round(args.block_s * 1e3 / work.step_ms[name])))
                  for name in args.workloads}
    print(f"steps per block {args.steps}", flush=True)
    blocks, attaches = [], []
    longest = 0.0
    host = {"node": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count()}
    for rnd in range(args.rounds):
        elapsed = time.monotonic() - t_start
        if rnd and elapsed + longest > args.budget_s:
            print(f"stopping after {rnd} rounds: {elapsed:.0f} s spent, a round takes up to {longest:.0f} s, "
                  f"budget {args.budget_s:.0f} s", flush=True)
            args.rounds = rnd
            break
        t_round = time.monotonic()
        order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
        print(f"round {rnd}: {', '.join(order)}", flush=True)
        for cfg in order:
            b, a = run_config(cfg, rnd, work, args, endpoint, store)
            blocks += b
            if cfg.startswith("agent"):
                attaches.append(a)
            for x in b:
                print(f"  round {rnd} {cfg:14s} {x['workload']:10s} median {x['median_ms']:.3f} ms", flush=True)
        longest = max(longest, time.monotonic() - t_round)
        write_result(args.out, argparse.Namespace(**{**vars(args), "rounds": rnd + 1}), work.info, blocks, attaches, host)
    work.quit()
    server.stop(0)
    wall_s = round(time.monotonic() - t_start, 1)
    print(write_result(args.out, args, work.info, blocks, attaches, host, wall_s=wall_s))
    print(f"\nwall time {wall_s} s; wrote {args.out}/overhead_ab.json and overhead_ab.md")


if __name__ == "__main__":
    main()
