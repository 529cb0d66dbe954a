"""Example inference loop: batches of requests through examples/train.py's model, forward only.

    sudo .venv/bin/otel-eacgm agent -- .venv/bin/python examples/inference.py --batches 50

The agent sees each batch's operators (embedding, attention, projections) and, on a GPU, their
kernel launches and the copy of the answers back to the host. Prints every batch's latency and
the p50/p99 at the end. Faults as in train.py, on the
host-side hook: `--fault input-stall` (requests arrive late), `memory-pressure`, `straggler`
(comm-slowdown needs gradients: it does nothing here).
"""

from __future__ import annotations

import argparse
import time

import torch

import faults
from train import TinyTransformer, add_model_arguments


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batches", type=int, default=20)
    add_model_arguments(ap)
    faults.add_arguments(ap)
    args = ap.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = TinyTransformer(1000, args.dim, args.layers, 4).to(device).eval()
    fault = faults.from_args(args, device)
    latencies = []
    with torch.inference_mode():
        for batch in range(args.batches):
            t0 = time.perf_counter()
            fault.before_step(batch)
            requests = torch.randint(0, 1000, (args.batch, args.seq), device=device)
            answers = model(requests)[:, -1].argmax(-1).cpu()  # .cpu() waits for the device
            latencies.append(time.perf_counter() - t0)
            print(f"batch {batch} answers {answers[:4].tolist()} {1000 * latencies[-1]:.1f} ms"
                  f"{fault.describe(batch)}", flush=True)
    ordered = sorted(latencies)
    p50, p99 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    print(f"{len(latencies)} batches: p50 {1000 * p50:.1f} ms, p99 {1000 * p99:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
