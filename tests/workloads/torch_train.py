"""A test workload: a few CPU PyTorch training steps of a small model, in plain user code.

Prints one JSON line per step with the wall-clock bracket around it (tests check that the
step's spans lie inside). usage: torch_train.py [STEPS]

CPython 3.11 fires its function__entry USDT probe only while a profile or trace function is
set (and on generator.throw); plain calls fire only function__return (CPython gh-98894).
Environment: EACGM_PY_PROFILE=1 sets a no-op profile function, as a profiler or coverage tool
would, so that the interpreter fires its entry probes; EACGM_SLOW_MM=1 adds one large matrix product (a slow call) after the steps;
EACGM_BAD_MM=1 adds one matrix product of mismatched shapes, caught (a failed call);
EACGM_THREAD_OPS=1 runs 20 matrix products on a second thread during the steps.
"""

import json
import os
import sys
import threading
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
    return float(loss.detach())


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randn(32, 4)
    time.sleep(0.2)  # let the agent finish attaching before the first step
    if os.environ.get("EACGM_PY_PROFILE") == "1":
        sys.setprofile(lambda *_: None)
    other = None
    if os.environ.get("EACGM_THREAD_OPS") == "1":  # operators on a second thread, at the same time
        other = threading.Thread(target=lambda: [torch.mm(x.t(), x) for _ in range(20)], name="side")
        other.start()
    for step in range(steps):
        t0 = time.time_ns()
        loss = train_step(model, opt, x, y)
        t1 = time.time_ns()
        print(json.dumps({"step": step, "start": t0, "end": t1, "loss": loss, "tid": os.getpid()}), flush=True)
    if other is not None:
        other.join()
        print(json.dumps({"side_thread": other.native_id}), flush=True)
    if os.environ.get("EACGM_SLOW_MM") == "1":
        a = torch.randn(1024, 1024)
        t0 = time.time_ns()
        torch.mm(a, a)
        print(json.dumps({"slow_mm": True, "start": t0, "end": time.time_ns()}), flush=True)
    if os.environ.get("EACGM_BAD_MM") == "1":
        try:
            torch.mm(torch.ones(2, 3), torch.ones(2, 3))
        except RuntimeError as exc:
            print(json.dumps({"bad_mm": str(exc).splitlines()[0]}), flush=True)
        torch.relu(torch.ones(2))  # the thread goes on: the failed call's frame is seen unwound


if __name__ == "__main__":
    main()
