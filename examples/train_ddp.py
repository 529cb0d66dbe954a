"""Example data-parallel training (DDP): examples/train.py's model on several ranks, one GPU each.

    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py --steps 20
    sudo .venv/bin/otel-eacgm agent -- .venv/bin/torchrun --standalone --nproc-per-node 2 examples/train_ddp.py

Each rank holds a replica; DDP all-reduces the gradients during backward through NCCL. Without
a GPU per rank it falls back, and says so, to gloo on CPU, so the example (and its faults) runs
anywhere; the agent then sees the ranks' torch operators but no NCCL calls. Every rank prints
its step times. Faults as in train.py (`--fault straggler --fault-rank 1`: one slow rank, the
others wait for it in their all-reduce). Run without torchrun it is a single rank.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import faults
from train import TinyTransformer, add_model_arguments, train_step


def pick_backend(choice: str, local_rank: int) -> tuple[str, torch.device]:
    """NCCL on this rank's GPU when there is one, else gloo on CPU with a message saying why."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if choice in ("auto", "nccl") and local_rank < gpus:
        return "nccl", torch.device("cuda", local_rank)
    if choice == "nccl":
        sys.exit(f"train_ddp: --backend nccl needs a GPU per rank; local rank {local_rank}, {gpus} GPU(s)")
    if choice == "auto":
        why = "no GPU" if gpus == 0 else f"{gpus} GPU(s) for local rank {local_rank}"
        # one write per line (print's message and newline are two): the ranks share the terminal
        print(f"train_ddp: {why}: falling back to gloo on CPU (NCCL needs one GPU per rank)\n",
              end="", file=sys.stderr, flush=True)
    return "gloo", torch.device("cpu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto")
    add_model_arguments(ap)
    faults.add_arguments(ap)
    args = ap.parse_args()
    if "RANK" not in os.environ:  # not under torchrun: one rank
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29532")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    backend, device = pick_backend(args.backend, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    torch.manual_seed(0)  # the same initial replica everywhere (DDP also broadcasts rank 0's)
    model = DistributedDataParallel(TinyTransformer(1000, args.dim, args.layers, 4).to(device),
                                    device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + rank)  # each rank its own data shard
    tokens = torch.randint(0, 1000, (args.batch, args.seq + 1), device=device)
    fault = faults.from_args(args, device, rank)
    for step in range(args.steps):
        t0 = time.perf_counter()
        fault.before_step(step)
        loss = train_step(model, opt, tokens, step=step, fault=fault)
        print(f"rank {rank}/{dist.get_world_size()} ({backend}) step {step} loss {loss:.4f} "
              f"{1000 * (time.perf_counter() - t0):.1f} ms{fault.describe(step)}\n", end="", flush=True)
    dist.barrier()  # a rank tearing gloo down while a peer still uses it aborts the peer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # The gloo backend of PyTorch 2.13 can abort (std::terminate, SIGABRT) while the interpreter
    # finalizes, after destroy_process_group: 1 run in 10 of the 2-rank CPU test on a loaded
    # 2-core VM, none in 30 once finalization is skipped. Everything is done and flushed here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
