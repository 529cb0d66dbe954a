"""Example training workload, single process: a small transformer trained for a few steps, unmodified.

Run it under the agent to see its operators and CUDA/NCCL calls (GPU) as spans:
    sudo .venv/bin/otel-eacgm agent -- .venv/bin/python examples/train.py --steps 20
On a GPU the step ends with a single-rank NCCL all-reduce of the gradients (torch.distributed,
world size 1) so the NCCL layer is exercised; without one it trains on CPU torch. Faults for
anomaly-detection demos: `--fault input-stall|comm-slowdown|memory-pressure|straggler` every
`--fault-every N` steps (examples/faults/); `--slow-step N` is a host-side stall of 0.3 s.
Multi-GPU (DDP): examples/train_ddp.py.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn

import faults


class TinyTransformer(nn.Module):
    """Embedding -> encoder layers -> vocabulary projection."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 4, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


def train_step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor, *, step: int,
               fault: faults.Fault, all_reduce: bool = False) -> float:
    """One optimizer step; `all_reduce` all-reduces the gradients by hand (DDP does its own)."""
    opt.zero_grad(set_to_none=True)
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if all_reduce:
        for g in grads:
            torch.distributed.all_reduce(g)
    fault.after_backward(step, grads)
    opt.step()
    return loss.item()


def add_model_arguments(ap: argparse.ArgumentParser) -> None:
    """Model and batch sizes, shared by the training and inference examples."""
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=10)
    add_model_arguments(ap)
    ap.add_argument("--slow-step", type=int, default=0, help="every Nth step stalls 0.3 s on the host")
    ap.add_argument("--no-nccl", action="store_true", help="skip the NCCL all-reduce on GPU")
    faults.add_arguments(ap)
    args = ap.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:  # init_process_group wants an indexed device
        device = torch.device("cuda", torch.cuda.current_device())
    distributed = device.type == "cuda" and not args.no_nccl
    if distributed:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        torch.distributed.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    fault = faults.from_args(args, device)
    model = TinyTransformer(1000, args.dim, args.layers, 4).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 1000, (args.batch, args.seq + 1), device=device)
    for step in range(args.steps):
        t0 = time.perf_counter()
        if args.slow_step and step % args.slow_step == args.slow_step - 1:
            time.sleep(0.3)
        fault.before_step(step)
        loss = train_step(model, opt, tokens, step=step, fault=fault, all_reduce=distributed)
        print(f"step {step} loss {loss:.4f} {1000 * (time.perf_counter() - t0):.1f} ms{fault.describe(step)}",
              flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
