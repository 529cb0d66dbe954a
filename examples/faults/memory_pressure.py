"""Memory pressure: allocation churn near the device's limit. A faulty step allocates most of
what is free, touches it and gives it back, so the allocator really maps and unmaps memory
(cudaMalloc/cudaFree in the traces) and the job runs close to an out-of-memory error."""

from __future__ import annotations

import torch

from faults.base import Fault

FRACTION = 0.9
CHUNK = 64 << 20
#: CPU runs have no device limit; they churn within this budget, so a smoke test never
#: pressures a shared host.
CPU_BUDGET = 256 << 20


class MemoryPressure(Fault):
    """Allocate FRACTION of the free device memory (CPU: of CPU_BUDGET) in CHUNK pieces, fill
    them, free them and empty the caching allocator."""

    name = "memory-pressure"

    def _target_bytes(self) -> int:
        if self.device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(self.device)
            return int(free * FRACTION)
        return int(CPU_BUDGET * FRACTION)

    def before_step(self, step: int) -> None:
        if not self.hits(step):
            return
        chunks = [torch.empty(CHUNK, dtype=torch.uint8, device=self.device).fill_(1)
                  for _ in range(self._target_bytes() // CHUNK)]
        self.report = f"allocated and freed {len(chunks) * CHUNK >> 20} MiB in {len(chunks)} chunks"
        del chunks
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
