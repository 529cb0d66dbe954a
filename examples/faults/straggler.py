"""Periodic straggling steps: one rank (or every rank) is slow now and then (thermal or
noisy-neighbour slowdowns, host interrupts). Under DDP the other ranks wait for it in their
gradient all-reduce, which is where the traces show it."""

from __future__ import annotations

import time

import torch

from faults.base import Fault

STRAGGLE_S = 0.3
SIZE = 512


class Straggler(Fault):
    """Busy the step's device with extra matrix products for STRAGGLE_S (real work, not a sleep:
    a straggler computes, its kernels appear in its trace)."""

    name = "straggler"

    def before_step(self, step: int) -> None:
        if not self.hits(step):
            return
        a = torch.randn(SIZE, SIZE, device=self.device)
        products, deadline = 0, time.monotonic() + STRAGGLE_S
        while time.monotonic() < deadline:
            a = torch.tanh(a @ a)
            products += 1
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        self.report = f"{products} extra {SIZE}x{SIZE} products in {STRAGGLE_S} s"
