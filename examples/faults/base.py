"""The hooks a fault offers the example loops, and when it strikes."""

from __future__ import annotations

import torch


class Fault:
    """No fault: the hooks do nothing. Subclasses override the hook where their fault lives.

    ``every``: the fault hits steps N-1, 2N-1, ... (every Nth step, counted from 0).
    ``report`` says what the last strike did, for the loop's step line.
    """

    name = "none"
    report = ""

    def __init__(self, *, every: int = 10, device: torch.device | None = None) -> None:
        if every < 1:
            raise ValueError(f"--fault-every {every}: must be >= 1")
        self.every = every
        self.device = device or torch.device("cpu")

    def describe(self, step: int) -> str:
        """A step line's suffix: the fault and what it did, empty on clean steps."""
        return f" fault={self.name}: {self.report}" if self.hits(step) else ""

    def hits(self, step: int) -> bool:
        """Whether `step` is a faulty step."""
        return self.name != "none" and step % self.every == self.every - 1

    def before_step(self, step: int) -> None:
        """Host side, while the next batch is produced."""

    def after_backward(self, step: int, grads: list[torch.Tensor]) -> None:
        """Between backward and the optimizer step, where gradients are communicated."""
