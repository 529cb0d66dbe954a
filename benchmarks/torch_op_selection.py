"""Which ATen operators the agent probes by default, before and after issue 28, and what that
costs a training step: operators probed, share of each step's operator time inside a probed
operator's span, probed calls per step and the probe hits they cost.

Per model of eacgm_testkit.torch_models (LSTM, GRU, RNN, transformer layer, CNN; CPU, one
thread), one step is profiled with torch.profiler after a warm-up. The selection is the
agent's own (torch_ops.select on the venv's libtorch_cpu.so) for the pre-issue-28 defaults
(their pattern list and the cap of 200, copied below) and for today's defaults. Each probed call
costs two probe hits (entry and exit); the cost per step is hits x `--hit-cost-us` (the agent's
probe_hit_cost_us default, 2 us inside PyTorch steps on the H200 host; docs/design.md), shown
against the untraced step's median wall time over `--steps` steps.

With --agent (root), the measured side: the LSTM+GRU language model of
tests/workloads/torch_recurrent.py runs `--agent-steps` steps untraced, then under the agent
(torch layer, spans sampled at 0, OTLP to a closed port) with the pre-issue-28 selection and
with today's defaults (shedding included), `--rounds` times each, interleaved; the median step
time of each and the added time per step.

usage: torch_op_selection.py [--steps 20] [--hit-cost-us 2.0] [--agent [--agent-steps 300] [--rounds 3]]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from eacgm_testkit.torch_models import cases, covered_share, probe_calls_of, profile_step  # noqa: E402
from otel_eacgm.config import AgentConfig  # noqa: E402
from otel_eacgm.probes import torch_ops  # noqa: E402

# The defaults before issue 28 (otel_eacgm/probes/torch_ops.py at 5adc55b), with torch_max_ops 200.
BEFORE_INCLUDE = (
    "matmul", "mm", "bmm", "addmm", "baddbmm", "linear",
    "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose*",
    "scaled_dot_product_attention", "_scaled_dot_product_*attention",
    "softmax", "_softmax", "log_softmax", "_log_softmax",
    "layer_norm", "native_layer_norm", "batch_norm", "native_batch_norm", "group_norm", "native_group_norm",
    "embedding", "dropout", "relu", "relu_", "gelu", "silu", "sigmoid", "tanh",
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_",
    "sum", "mean", "amax", "max", "argmax",
    "cross_entropy_loss", "nll_loss*", "mse_loss",
    "copy_", "to", "_to_copy", "clone", "contiguous",
    "_foreach_*",
    "*_backward",
)
BEFORE_CAP = 200


def step_ms(cmd: list[str], steps: int, env: dict[str, str]) -> float:
    """Median step time (ms) of the recurrent workload under `cmd` (empty: untraced), its first
    five steps left out (warm-up, attaching)."""
    workload = str(REPO / "tests/workloads/torch_recurrent.py")
    out = subprocess.run([*cmd, sys.executable, workload, str(steps)], capture_output=True, text=True, env=env,
                         timeout=600, check=True).stdout
    times = [(r["end"] - r["start"]) / 1e6 for r in map(json.loads, (x for x in out.splitlines() if x.startswith("{")))]
    return statistics.median(times[5:])


def measure_agent(steps: int, rounds: int) -> None:
    """The measured per-step cost, before and after (see the module docstring)."""
    agent = [str(REPO / ".venv/bin/otel-eacgm"), "agent", "--endpoint", "http://127.0.0.1:9", "--insecure",
             "--layers", "torch", "--sample-ratio", "0", "--"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {
        "OTEL_EACGM_GPU_METRICS": "0", "OTEL_EACGM_EXPORT_TIMEOUT_S": "1"}
    configs = {"untraced": ([], env),
               "before (old patterns, cap 200)": (agent, env | {"OTEL_EACGM_TORCH_INCLUDE": ",".join(BEFORE_INCLUDE),
                                                              "OTEL_EACGM_TORCH_MAX_OPS": str(BEFORE_CAP)}),
               "after (defaults)": (agent, env)}
    runs: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(rounds):
        for name, (cmd, cfg_env) in configs.items():
            runs[name].append(step_ms(cmd, steps, cfg_env))
    base = statistics.median(runs["untraced"])
    print(f"\nmeasured: tests/workloads/torch_recurrent.py, {steps} steps, median step of each run, "
          f"median of {rounds} runs")
    for name, values in runs.items():
        med = statistics.median(values)
        print(f"  {name:32} {med:8.2f} ms/step  +{med - base:6.2f} ms ({100 * (med / base - 1):5.1f}%)   "
              + " ".join(f"{v:.2f}" for v in values))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="untraced steps timed per model (median)")
    ap.add_argument("--hit-cost-us", type=float, default=AgentConfig().probe_hit_cost_us, help="cost of one probe hit")
    ap.add_argument("--agent", action="store_true", help="also measure steps under the agent (needs root)")
    ap.add_argument("--agent-steps", type=int, default=300, help="steps of each measured run")
    ap.add_argument("--rounds", type=int, default=3, help="measured runs of each configuration")
    args = ap.parse_args()
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    lib = str(Path(torch.__file__).parent / "lib/libtorch_cpu.so")
    ops = torch_ops.discover(lib)
    cfg = AgentConfig()
    selections = {}
    for label, include, exclude, cap in (("before", BEFORE_INCLUDE, torch_ops.DEFAULT_EXCLUDE, BEFORE_CAP),
                                         ("after", cfg.torch_include, cfg.torch_exclude, cfg.torch_max_ops)):
        chosen, dropped = torch_ops.select(ops, include, exclude, cap)
        selections[label] = {op.name for op in chosen}
        print(f"{label}: {len(chosen)} operator entry points probed of {len(chosen) + dropped} matching "
              f"({len(ops)} in {lib}), cap {cap}")
    print(f"\ntorch {torch.__version__}, 1 thread; hit cost {args.hit_cost_us} us; cost = 2 hits per probed call")
    print(f"{'model':12} {'step ms':>8} | {'covered':>8} {'calls':>6} {'cost ms':>8} {'cost %':>7} | "
          f"{'covered':>8} {'calls':>6} {'cost ms':>8} {'cost %':>7} | missing before")
    print(f"{'':12} {'':>8} | {'before':^32} | {'after':^32} |")
    for case in cases():
        # the median of three profiled steps (by covered share after): one the host preempted must not decide
        profiles = sorted((covered_share(p, selections["after"]), i, p) for i, p in
                          enumerate(profile_step(case) for _ in range(3)))
        calls = profiles[1][2]
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            case.step()
            times.append(time.perf_counter() - t0)
        step_ms = 1e3 * statistics.median(times)
        row = f"{case.name:12} {step_ms:8.2f} |"
        for label in ("before", "after"):
            probed = selections[label]
            n = probe_calls_of(calls, probed)
            cost_ms = 2 * n * args.hit_cost_us / 1e3
            row += f" {100 * covered_share(calls, probed):7.1f}% {n:6d} {cost_ms:8.3f} {100 * cost_ms / step_ms:6.1f}% |"
        missing = sorted({c.name for c in calls if c.name in selections["after"]} - selections["before"])
        print(row, ", ".join(m.removeprefix("aten::") for m in missing[:6]) + (" ..." if len(missing) > 6 else ""))
    if args.agent:
        measure_agent(args.agent_steps, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
