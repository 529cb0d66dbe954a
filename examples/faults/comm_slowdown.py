"""Communication slowdown: a faulty step sends its gradients through the collective library
several more times, as a mis-configured gradient sync (every bucket reduced again by each of
several hooks) or an accidental all-reduce in a loop would look in the traces.

The extra collectives reuse the gradient tensors, so the fault moves more data through NCCL
and nothing else: an earlier version all-reduced a fresh buffer 8 times the gradients' size,
which also raised the process' GPU memory, a second fault that the memory metrics rightly
reported first (docs/benchmarks.md, the H200 runs of 2026-12-04).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from faults.base import Fault

EXTRA_ALLREDUCES = 4  # each gradient is all-reduced this many more times in a faulty step


class CommSlowdown(Fault):
    """EXTRA_ALLREDUCES more all-reduces of every gradient after a faulty step's backward.

    A single-process run has no process group: one of world size 1 is started (NCCL on GPU,
    gloo on CPU) so the all-reduces really go through the communication library. A sum over
    one rank leaves the gradients as they were, so training goes on unchanged.
    """

    name = "comm-slowdown"

    def after_backward(self, step: int, grads: list[torch.Tensor]) -> None:
        if not self.hits(step):
            return
        if not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo",
                                    store=dist.HashStore(), rank=0, world_size=1)
        for _ in range(EXTRA_ALLREDUCES):
            for g in grads:
                dist.all_reduce(g)
        moved = EXTRA_ALLREDUCES * sum(g.numel() * g.element_size() for g in grads)
        self.report = (f"{EXTRA_ALLREDUCES} extra all-reduces of each of {len(grads)} gradients, {moved / 1e6:.1f} MB "
                       f"({dist.get_backend()}, world size {dist.get_world_size()})")
