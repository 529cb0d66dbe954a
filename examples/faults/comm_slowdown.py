"""Communication slowdown: a faulty step moves far more data through the collective library
(extra and larger all-reduces), as a mis-bucketed DDP model, an accidental all-reduce of
activations or a congested fabric would look in the traces."""

from __future__ import annotations

import torch
import torch.distributed as dist

from faults.base import Fault

EXTRA_ALLREDUCES = 4
SCALE = 8  # each extra all-reduce moves SCALE x the gradients' elements


class CommSlowdown(Fault):
    """EXTRA_ALLREDUCES all-reduces of SCALE x the gradients' size after a faulty step's backward.

    A single-process run has no process group: one of world size 1 is started (NCCL on GPU,
    gloo on CPU) so the all-reduces really go through the communication library.
    """

    name = "comm-slowdown"

    def after_backward(self, step: int, grads: list[torch.Tensor]) -> None:
        if not self.hits(step):
            return
        if not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo",
                                    store=dist.HashStore(), rank=0, world_size=1)
        numel = sum(g.numel() for g in grads)
        buf = torch.ones(SCALE * numel, device=self.device)
        for _ in range(EXTRA_ALLREDUCES):
            dist.all_reduce(buf)
        self.report = (f"{EXTRA_ALLREDUCES} extra all-reduces of {buf.numel() * 4 / 1e6:.1f} MB "
                       f"({dist.get_backend()}, world size {dist.get_world_size()})")
