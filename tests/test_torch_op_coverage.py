"""The default operator set, as the agent selects it from the venv's real libtorch_cpu.so (cap
included), holds the operator time of a training step of each common model family, measured
with torch.profiler: the recurrent layers and their backward, attention, convolution,
normalization, embedding, losses and optimizers are probed themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_eacgm.config import AgentConfig
from otel_eacgm.probes import torch_ops

LIB = Path(__file__).resolve().parent.parent / ".venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so"
pytestmark = pytest.mark.skipif(not LIB.exists(), reason="torch is not installed in .venv")

MIN_COVERED = 0.9


@pytest.fixture(scope="module")
def probed() -> set[str]:
    cfg = AgentConfig()
    chosen, _ = torch_ops.select(torch_ops.discover(str(LIB)), cfg.torch_include, cfg.torch_exclude,
                                 cfg.torch_max_ops)
    return {op.name for op in chosen}


@pytest.fixture(scope="module")
def profiles() -> dict:
    import torch  # noqa: PLC0415

    from eacgm_testkit.torch_models import cases, profile_step  # noqa: PLC0415

    torch.set_num_threads(1)
    # three profiled steps per model: a step the 2-core host preempted (4 ms of one reshape, seen
    # once) must not decide; the median step does
    return {case.name: [profile_step(case) for _ in range(3)] for case in cases()}


def test_each_family_has_its_own_operators_probed(probed: set[str]) -> None:
    assert {"aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward",
            "aten::scaled_dot_product_attention", "aten::_native_multi_head_attention", "aten::convolution",
            "aten::convolution_backward", "aten::native_batch_norm_backward", "aten::native_layer_norm_backward",
            "aten::embedding", "aten::embedding_dense_backward", "aten::cross_entropy_loss",
            "aten::nll_loss_backward", "aten::_foreach_add_", "aten::_foreach_addcdiv_", "aten::_foreach_norm",
            "aten::addmm", "aten::copy_"} <= probed


@pytest.mark.parametrize("model", ["lstm", "gru", "rnn", "transformer", "cnn"])
def test_the_default_set_covers_the_steps_operator_time(profiles: dict, probed: set[str], model: str) -> None:
    from eacgm_testkit.torch_models import covered_share  # noqa: PLC0415

    shares = sorted((covered_share(calls, probed), i) for i, calls in enumerate(profiles[model]))
    share, median = shares[1]
    calls = profiles[model][median]
    unseen: dict[str, float] = {}
    for c in calls:
        if c.name not in probed and not probed.intersection(c.ancestors):
            unseen[c.name] = unseen.get(c.name, 0.0) + c.self_us
    assert share >= MIN_COVERED, (model, share, sorted(unseen.items(), key=lambda kv: -kv[1])[:10])


def test_the_recurrent_operators_time_is_their_own(profiles: dict, probed: set[str]) -> None:
    """The LSTM layer and its backward are spans of their own, not time hidden in a parent."""
    names = {c.name for c in profiles["lstm"][0]}
    assert {"aten::lstm", "aten::mkldnn_rnn_layer_backward"} <= names & probed
