"""A test workload: CPU training steps of a small word-language model with an LSTM and a GRU
(the shape of PyTorch's word_language_model example, random tokens), in plain user code.

Prints one JSON line per step with its wall-clock bracket. usage: torch_recurrent.py [STEPS]
EACGM_PY_PROFILE=1 sets a no-op profile function so CPython 3.11 fires its function entry
probes (see torch_train.py).
"""

import json
import os
import sys
import time

import torch
from torch import nn


class RecurrentLM(nn.Module):
    def __init__(self, vocab: int = 500, dim: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, dim)
        self.gru = nn.GRU(dim, dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.emb(x))
        h, _ = self.gru(h)
        return self.out(h)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x).reshape(-1, 500), y.reshape(-1))
    loss.backward()
    opt.step()
    return float(loss.detach())


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = RecurrentLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randint(0, 500, (10, 4)), torch.randint(0, 500, (10, 4))
    time.sleep(0.2)  # let the agent finish attaching before the first step
    if os.environ.get("EACGM_PY_PROFILE") == "1":
        sys.setprofile(lambda *_: None)
    for step in range(steps):
        t0 = time.time_ns()
        loss = train_step(model, opt, x, y)
        print(json.dumps({"step": step, "start": t0, "end": time.time_ns(), "loss": loss, "tid": os.getpid()}),
              flush=True)


if __name__ == "__main__":
    main()
