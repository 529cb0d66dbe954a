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

usage: torch_op_selection.py [--steps 20] [--hit-cost-us 2.0]
"""

from __future__ import annotations

import argparse
import statistics
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="untraced steps timed per model (median)")
    ap.add_argument("--hit-cost-us", type=float, default=AgentConfig().probe_hit_cost_us, help="cost of one probe hit")
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
        calls = profile_step(case)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
