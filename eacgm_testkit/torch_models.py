"""Small models of the families whose time the default operator set must cover (recurrent,
attention, convolution with normalization, embedding, losses, optimizers), and what
torch.profiler says about where a training step's operator time goes.

Shared by tests/test_torch_op_coverage.py (the default set covers each step's time) and
benchmarks/torch_op_selection.py (operator count and probe hits per step, before and after).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import torch
from torch import nn


class WordLSTM(nn.Module):
    """The word-language model of PyTorch's examples, small: embedding, LSTM, decoder."""

    def __init__(self, vocab: int = 1000, dim: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim, num_layers=layers, dropout=0.2 if layers > 1 else 0.0)
        self.out = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.emb(x))
        return self.out(h)


class WordGRU(WordLSTM):
    """The same with a GRU (on CPU it runs as cell operators, not one fused kernel)."""

    def __init__(self, vocab: int = 1000, dim: int = 128) -> None:
        super().__init__(vocab, dim, 1)
        self.rnn = nn.GRU(dim, dim)


class WordRNN(WordLSTM):
    """The same with a plain tanh RNN."""

    def __init__(self, vocab: int = 1000, dim: int = 128) -> None:
        super().__init__(vocab, dim, 1)
        self.rnn = nn.RNN(dim, dim)


class TinyTransformer(nn.Module):
    """One encoder layer (attention, layer norm, feed-forward) over embeddings."""

    def __init__(self, vocab: int = 1000, dim: int = 128) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.enc = nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.1)
        self.out = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.enc(self.emb(x)))


class TinyCNN(nn.Module):
    """Convolutions with batch norm and pooling, as in image classifiers."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(4, 32), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@dataclasses.dataclass
class Case:
    """A model, its optimizer and one batch: a training step to profile."""

    name: str
    step: Callable[[], None]


def _token_case(name: str, model: nn.Module, optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
                vocab: int = 1000) -> Case:
    opt = optimizer(model.parameters())
    x, y = torch.randint(0, vocab, (20, 8)), torch.randint(0, vocab, (20, 8))  # 20 steps, batch 8

    def step() -> None:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        opt.step()

    return Case(name, step)


def cases() -> list[Case]:
    """One training step per model family, with the optimizers such models use."""
    torch.manual_seed(0)
    cnn = TinyCNN()
    cnn_opt = torch.optim.SGD(cnn.parameters(), lr=0.01, momentum=0.9)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))

    def cnn_step() -> None:
        cnn_opt.zero_grad()
        nn.functional.cross_entropy(cnn(images), labels).backward()
        cnn_opt.step()

    return [
        _token_case("lstm", WordLSTM(), lambda p: torch.optim.SGD(p, lr=0.1)),
        _token_case("gru", WordGRU(), lambda p: torch.optim.Adam(p, lr=1e-3)),
        _token_case("rnn", WordRNN(), lambda p: torch.optim.SGD(p, lr=0.1)),
        _token_case("transformer", TinyTransformer(), lambda p: torch.optim.AdamW(p, lr=1e-3)),
        Case("cnn", cnn_step),
    ]


@dataclasses.dataclass(frozen=True)
class OpTime:
    """One operator call of a profiled step."""

    name: str                 # "aten::addmm"
    self_us: float            # time in the operator itself, not in operators under it
    ancestors: tuple[str, ...]  # enclosing operator and autograd events, innermost first


def profile_step(case: Case) -> list[OpTime]:
    """The operator calls of one step (after a warm-up step), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415 - heavy, only when profiling

    case.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        case.step()
    out = []
    for ev in prof.events():
        if not ev.name.startswith("aten::"):
            continue
        up, parent = [], ev.cpu_parent
        while parent is not None:
            up.append(parent.name)
            parent = parent.cpu_parent
        out.append(OpTime(ev.name, ev.self_cpu_time_total, tuple(up)))
    return out


def covered_share(calls: list[OpTime], probed: set[str]) -> float:
    """Share of the step's operator time inside a probed operator's span: the operator itself
    or one of its enclosing operators is probed."""
    total = sum(c.self_us for c in calls)
    seen = sum(c.self_us for c in calls if c.name in probed or probed.intersection(c.ancestors))
    return seen / total if total else 1.0


def probe_calls_of(calls: list[OpTime], probed: set[str]) -> int:
    """Operator calls that hit a probe (each costs an entry and an exit hit)."""
    return sum(1 for c in calls if c.name in probed)
