"""A long-lived PyTorch process that runs measured blocks of steps on command, for A/B overhead runs.

It builds every workload once, warms each up, then reads one JSON command per line on stdin and
answers one JSON line on stdout (lines starting with ``{``; anything else on stdout is noise):

    {"cmd": "block", "workload": "gpt_gpu", "steps": 10, "profiler": false}
    -> {"workload": "gpt_gpu", "times_ms": [...], "t0_ns": ..., "t1_ns": ..., "bounds_ns": [[start, end], ...],
        "profiler": false}
    {"cmd": "quit"}

So a driver (benchmarks/overhead_ab.py) can attach the agent to this pid, run blocks, detach it,
and compare with untraced blocks of the same process. Workloads:

* ``gpt_gpu``: a GPT-2-small-shaped decoder (``--layers`` 12, ``--dim`` 768, 12 heads, vocabulary
  50257, tied head) training step with AdamW, batch x seq ``--gpu-batch`` x ``--gpu-seq``
  (64 x 1024: GPU-bound);
* ``gpt_launch``: the same model and optimizer at ``--launch-batch`` x ``--launch-seq`` (8 x 512:
  bound by the host launching kernels);
* ``tiny``: ``--tiny-kernels`` in-place adds on a 256-element tensor per step (launch-bound loop);
* ``infer``: forward passes of the same model under ``torch.inference_mode`` at
  ``--infer-batch`` x ``--infer-seq``.

Every step ends with one all-reduce through a world-size-1 process group (NCCL on CUDA, gloo on
CPU; file:// rendezvous, no port) of ``--allreduce-mb`` MB (training: one DDP-bucket-sized
buffer), then a device synchronize, so each step's wall time is what it cost. Parameters are in
``--dtype`` (bf16 on CUDA by default, fp32 on CPU). ``--preset cpu-smoke`` shrinks everything.
``torch.profiler`` blocks run in-process (CPU + CUDA activities), profiler overhead included.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

WORKLOADS = ("gpt_gpu", "gpt_launch", "tiny", "infer")
CPU_SMOKE = {"layers": 2, "dim": 64, "heads": 4, "vocab": 512, "gpu_batch": 4, "gpu_seq": 64,
             "launch_batch": 2, "launch_seq": 32, "infer_batch": 2, "infer_seq": 32, "tiny_kernels": 200,
             "allreduce_mb": 0.25}


class Block(nn.Module):
    """Pre-norm decoder block: causal self-attention (SDPA: flash attention on CUDA) and a 4x MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2-shaped language model: token + position embeddings, blocks, final norm, tied head."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, max_seq: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(max_seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln(x), self.wte.weight)


class Workloads:
    """Every workload's tensors, built once; ``step(name)`` runs one step of one of them."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.device = device
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
        max_seq = max(args.gpu_seq, args.launch_seq, args.infer_seq)
        self.model = GPT(args.vocab, args.dim, args.layers, args.heads, max_seq).to(device=device, dtype=dtype)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        gen = torch.Generator(device="cpu").manual_seed(0)

        def tokens(batch: int, seq: int) -> torch.Tensor:
            return torch.randint(0, args.vocab, (batch, seq + 1), generator=gen).to(device)

        self.tokens = {"gpt_gpu": tokens(args.gpu_batch, args.gpu_seq),
                       "gpt_launch": tokens(args.launch_batch, args.launch_seq),
                       "infer": tokens(args.infer_batch, args.infer_seq)[:, :-1]}
        elems = max(1, int(args.allreduce_mb * 1e6 / 4))
        self.bucket = torch.zeros(elems, device=device)           # training: one gradient bucket
        self.small = torch.zeros(min(elems, 1 << 18), device=device)  # tiny / infer: <= 1 MB
        self.tiny = torch.zeros(256, device=device)
        self.tiny_kernels = args.tiny_kernels

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self, name: str) -> None:
        """One step of workload ``name``, all-reduce and synchronize included."""
        if name in ("gpt_gpu", "gpt_launch"):
            tok = self.tokens[name]
            self.opt.zero_grad(set_to_none=True)
            logits = self.model(tok[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tok[:, 1:].reshape(-1))
            loss.backward()
            dist.all_reduce(self.bucket)
            self.opt.step()
        elif name == "infer":
            with torch.inference_mode():
                self.model(self.tokens["infer"]).argmax(-1)
            dist.all_reduce(self.small)
        elif name == "tiny":
            for _ in range(self.tiny_kernels):
                self.tiny.add_(1.0)
            dist.all_reduce(self.small)
        else:
            raise ValueError(f"unknown workload {name!r}; expected one of {WORKLOADS}")
        self._sync()

    def block(self, name: str, steps: int, profiler: bool) -> list[float]:
        """Wall milliseconds of each of ``steps`` steps (under torch.profiler when asked); each
        step's CLOCK_MONOTONIC start and end go to ``self.bounds_ns`` (the agent's pause log
        uses that clock: benchmarks/overhead_paired.py)."""
        times: list[float] = []
        self.bounds_ns: list[tuple[int, int]] = []

        def run() -> None:
            for _ in range(steps):
                s0, t0 = time.monotonic_ns(), time.perf_counter()
                self.step(name)
                times.append((time.perf_counter() - t0) * 1e3)
                self.bounds_ns.append((s0, time.monotonic_ns()))

        if profiler:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            with torch.profiler.profile(activities=acts):
                run()
        else:
            run()
        return times


def init_process_group(device: torch.device, rendezvous: str) -> None:
    """World-size-1 group: NCCL on CUDA (so the NCCL layer is exercised), gloo on CPU."""
    if device.type == "cuda":
        dist.init_process_group("nccl", init_method=f"file://{rendezvous}", rank=0, world_size=1, device_id=device)
    else:
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """Device, dtype and size flags (shared with the drivers, which pass them through)."""
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], help="parameter dtype (default bf16 on CUDA, fp32 on CPU)")
    ap.add_argument("--preset", choices=["gpt2-small", "cpu-smoke"], default="gpt2-small",
                    help="cpu-smoke: tiny shapes that run anywhere in seconds (explicit flags still win)")
    for flag, default in (("layers", 12), ("dim", 768), ("heads", 12), ("vocab", 50257), ("gpu-batch", 64),
                          ("gpu-seq", 1024), ("launch-batch", 8), ("launch-seq", 512), ("infer-batch", 8),
                          ("infer-seq", 512), ("tiny-kernels", 1000)):
        ap.add_argument(f"--{flag}", type=int, help=f"default {default} (gpt2-small)")
    ap.add_argument("--allreduce-mb", type=float, help="all-reduce per training step, MB (default 25)")
    ap.add_argument("--warmup-steps", type=int, default=3, help="steps per workload before the first block")


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill unset sizes from the preset."""
    full = {"layers": 12, "dim": 768, "heads": 12, "vocab": 50257, "gpu_batch": 64, "gpu_seq": 1024,
            "launch_batch": 8, "launch_seq": 512, "infer_batch": 8, "infer_seq": 512, "tiny_kernels": 1000,
            "allreduce_mb": 25.0}
    preset = dict(full, **CPU_SMOKE) if args.preset == "cpu-smoke" else full
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.dtype is None:
        args.dtype = "bf16" if args.device.startswith("cuda") else "fp32"
    if args.dim % args.heads:
        raise SystemExit(f"--dim {args.dim} must be a multiple of --heads {args.heads}")
    return args


def _reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(ap)
    args = resolve(ap.parse_args())
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:  # NCCL's device_id wants an index
        device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        init_process_group(device, os.path.join(tmp, "rendezvous"))
        work = Workloads(args, device)
        warm = {}
        for name in WORKLOADS:
            warm[name] = work.block(name, args.warmup_steps, profiler=False)
        params = sum(p.numel() for p in work.model.parameters())
        _reply({"ready": True, "pid": os.getpid(), "device": str(device), "dtype": args.dtype, "params": params,
                "torch": torch.__version__, "warmup_ms": {k: [round(x, 3) for x in v] for k, v in warm.items()},
                "sizes": {k: getattr(args, k) for k in ("layers", "dim", "heads", "vocab", "gpu_batch", "gpu_seq",
                                                        "launch_batch", "launch_seq", "infer_batch", "infer_seq",
                                                        "tiny_kernels", "allreduce_mb")}})
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "quit":
                break
            t0 = time.time_ns()
            times = work.block(cmd["workload"], int(cmd["steps"]), bool(cmd.get("profiler")))
            _reply({"workload": cmd["workload"], "times_ms": times, "t0_ns": t0, "t1_ns": time.time_ns(),
                    "bounds_ns": work.bounds_ns,
                    "profiler": bool(cmd.get("profiler")),
                    "finite": all(math.isfinite(t) for t in times)})
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
