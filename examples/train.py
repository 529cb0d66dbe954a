"""Example training workload: a small transformer trained for a few steps, unmodified.

Run it under the agent to see its CUDA/NCCL calls (GPU) as spans:
    sudo .venv/bin/otel-eacgm agent -- python examples/train.py --device cuda --steps 20
On a GPU the step ends with a single-rank NCCL all-reduce of the gradients (torch.distributed,
world size 1) so the NCCL layer is exercised; `--slow-step N` makes every Nth step slow
(host-side stall) for anomaly-detection demos.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn


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


def train_step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor, distributed: bool) -> float:
    """One optimizer step (with a gradient all-reduce when distributed)."""
    opt.zero_grad(set_to_none=True)
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    if distributed:
        for p in model.parameters():
            torch.distributed.all_reduce(p.grad)
    opt.step()
    return loss.item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--slow-step", type=int, default=0, help="every Nth step stalls 0.3 s on the host")
    ap.add_argument("--no-nccl", action="store_true", help="skip the NCCL all-reduce on GPU")
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
    model = TinyTransformer(1000, args.dim, args.layers, 4).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 1000, (args.batch, args.seq + 1), device=device)
    for step in range(args.steps):
        t0 = time.perf_counter()
        if args.slow_step and step % args.slow_step == args.slow_step - 1:
            time.sleep(0.3)
        loss = train_step(model, opt, tokens, distributed)
        print(f"step {step} loss {loss:.4f} {1000 * (time.perf_counter() - t0):.1f} ms", flush=True)
    if distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
