"""A test workload: a few CPU PyTorch training steps of a small model, in plain user code.

Prints one JSON line per step with the wall-clock bracket around it (tests check that the
step's span and the operator spans under it lie inside). usage: torch_train.py [STEPS]
Environment: EACGM_FAIL_STEP=1 makes the last step call a function that raises.
"""

import json
import os
import sys
import time

import torch
from torch import nn


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((model(x) - y) ** 2).mean()


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    opt.zero_grad()
    loss = loss_of(model, x, y)
    loss.backward()
    opt.step()
    return float(loss)


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randn(32, 4)
    time.sleep(0.2)  # let the agent finish attaching before the first step
    for step in range(steps):
        t0 = time.time_ns()
        loss = train_step(model, opt, x, y)
        t1 = time.time_ns()
        print(json.dumps({"step": step, "start": t0, "end": t1, "loss": loss, "tid": os.getpid()}), flush=True)


if __name__ == "__main__":
    main()
