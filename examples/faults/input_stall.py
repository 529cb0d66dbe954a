"""Host-side input stall: the data pipeline is late (slow storage, a decode hiccup, a starved
loader worker), so the device idles while the host waits."""

from __future__ import annotations

import time

from faults.base import Fault

STALL_S = 0.5


class InputStall(Fault):
    """Sleep STALL_S on the host before a faulty step's batch is ready."""

    name = "input-stall"

    def before_step(self, step: int) -> None:
        if self.hits(step):
            time.sleep(STALL_S)
            self.report = f"input stalled {STALL_S} s"
