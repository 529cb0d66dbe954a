"""The overhead guardrail cycles PyTorch operator probes (uprobe_multi links): a steady loop of
in-place adds over budget gets its operator probes duty-cycled, and the operator's call count
is extrapolated close to the number of calls the loop made.

The adds are of 4M floats (milliseconds each), so that the probes barely slow the loop and the
extrapolation's correction for that slowdown, which rests on the configured per-hit cost, stays
small (tests/test_guardrail_decisions.py checks that correction on its own). The budget is set low (0.1%) so
that the loop is clearly over it on any machine; what is checked is the mechanism, not this
VM's speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agent_run import agent_cmd, summary, wait_for_earlier_releases

pytestmark = pytest.mark.ebpf

SECONDS = 8
LOOP = f"""
import json, time, torch
x = torch.zeros(1 << 22)
n, end = 0, time.monotonic() + {SECONDS}
while time.monotonic() < end:
    x.add_(x)
    n += 1
print(json.dumps({{"adds": n}}))
"""


def test_over_budget_operator_probes_are_cycled_and_their_counts_extrapolated(pipeline) -> None:  # noqa: ANN001
    wait_for_earlier_releases()
    env = dict(os.environ, OTEL_EACGM_OVERHEAD_BUDGET="0.001", OTEL_EACGM_PROBE_HIT_COST_US="10",
               OTEL_EACGM_GUARDRAIL_PERIOD_S="1", OTEL_EACGM_METRICS_INTERVAL_S="1", OTEL_EACGM_LOG_LEVEL="info",
               OTEL_EACGM_TORCH_INCLUDE="add_", OTEL_EACGM_GPU_METRICS="0",
               # no spans: on 2 cores the agent and the collector handling a span per call while
               # the probes are attached would slow the loop in just those phases
               OTEL_EACGM_SPAN_SAMPLE_RATIO="0")
    cmd = agent_cmd(pipeline.grpc_endpoint, "--layers", "torch", "--", sys.executable, "-c", LOOP)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    made = json.loads(proc.stdout.strip().splitlines()[-1])["adds"]
    throttled = [ln for ln in proc.stderr.splitlines() if "guardrail: probes would cost" in ln]
    assert throttled and "add_" in throttled[0], proc.stderr[-3000:]
    captured = summary(proc.stderr)["calls"]  # seen by the probes, sent or not
    assert captured < 0.7 * made, (captured, made, [ln for ln in proc.stderr.splitlines() if "guardrail" in ln])

    def adds() -> float:
        points = [p for p in pipeline.store.metric_points() if p["name"] == "eacgm.calls" and
                  p["attributes"].get("code.function.name") == "aten::add_"]
        return max((p["value"] for p in points), default=0)

    # the statistics divide what was counted by the attached share of each window
    assert pipeline.store.wait_for(lambda: adds() > 0.75 * made, 15), (adds(), made, captured)
    assert adds() < 1.25 * made, (adds(), made)


NESTED_LOOP = f"""
import json, time, torch
x, w = torch.zeros(64, 64), torch.ones(64, 64)
n, end = 0, time.monotonic() + {SECONDS}
while time.monotonic() < end:
    torch.nn.functional.linear(x, w).add_(x)  # aten::linear > aten::t, aten::matmul/addmm ...: nested operators
    n += 1
print(json.dumps({{"steps": n}}))
"""


def test_returns_in_the_cycle_gap_are_counted_apart_from_unmatched_returns(pipeline) -> None:  # noqa: ANN001
    """Cycled operator entries are detached a tick before their exit probes and attached again
    after them, so calls made in between return with no frame: they are `cycled_returns`, not
    `unmatched_returns`, which stays near zero on a steady loop traced from its start."""
    wait_for_earlier_releases()
    env = dict(os.environ, OTEL_EACGM_OVERHEAD_BUDGET="0.001", OTEL_EACGM_PROBE_HIT_COST_US="10",
               OTEL_EACGM_GUARDRAIL_PERIOD_S="1", OTEL_EACGM_LOG_LEVEL="info", OTEL_EACGM_GPU_METRICS="0",
               OTEL_EACGM_SPAN_SAMPLE_RATIO="0",
               # the guardrail's cycling is under test: an operator shed for good is never cycled
               OTEL_EACGM_TORCH_SHED_SHARE="0")
    cmd = agent_cmd(pipeline.grpc_endpoint, "--layers", "torch", "--", sys.executable, "-c", NESTED_LOOP)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert any("guardrail: probes would cost" in ln for ln in proc.stderr.splitlines()), proc.stderr[-3000:]
    done = summary(proc.stderr)
    assert done["cycled_returns"] > 0, done
    # the guardrail's gaps made hundreds of returns without entries here: none may be called unmatched
    assert done["unmatched_returns"] <= max(5, done["cycled_returns"] // 20), done
