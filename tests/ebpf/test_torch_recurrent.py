"""A recurrent model traced through the real Collector with the default operator set: the
LSTM and GRU layers and the LSTM's backward are spans under the Python training step (issue
28: `aten::lstm` never appeared, the default patterns and the cap left it out)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest

from agent_run import REPO, agent_cmd, exported_spans

pytestmark = pytest.mark.ebpf

WORKLOAD = str(REPO / "tests/workloads/torch_recurrent.py")
STEPS = 2


@pytest.fixture(scope="module")
def recurrent_spans(pipeline) -> list[dict]:  # noqa: ANN001
    cmd = agent_cmd(pipeline.grpc_endpoint, "--layers", "torch,python", "--", sys.executable, WORKLOAD, str(STEPS))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(
        os.environ, OTEL_EACGM_GPU_METRICS="0", EACGM_PY_PROFILE="1", OTEL_EACGM_SPAN_SAMPLE_RATIO="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    pid = next(json.loads(line)["tid"] for line in proc.stdout.splitlines() if line.startswith("{"))
    return exported_spans(pipeline.store, pid, proc.stderr)


def ancestors(span: dict, by_id: dict[str, dict]) -> list[str]:
    out = []
    while span["parent_span_id"]:
        span = by_id[span["parent_span_id"]]
        out.append(span["name"])
    return out


def test_recurrent_layers_and_their_backward_are_under_the_step(recurrent_spans: list[dict]) -> None:
    by_id = {s["span_id"]: s for s in recurrent_spans}
    steps = [s for s in recurrent_spans if s["name"] == "train_step"]
    assert len(steps) == STEPS
    under_step = collections.Counter(s["name"] for s in recurrent_spans if "train_step" in ancestors(s, by_id))
    # forward: the layer operators; backward: the LSTM's fused backward (mkldnn on CPU)
    for name in ("aten::lstm", "aten::gru", "aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward"):
        assert under_step[name] >= STEPS, (name, under_step.most_common(40))
    for lstm in (s for s in recurrent_spans if s["name"] == "aten::lstm"):
        assert ancestors(lstm, by_id)[:2] == ["LSTM.forward", "RecurrentLM.forward"]
    # the loss and the embedding's backward are there too
    assert under_step["aten::cross_entropy_loss"] >= STEPS and under_step["aten::embedding_dense_backward"] >= STEPS
