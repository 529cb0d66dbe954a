"""The overhead guardrail on real probes: a steady launch loop over budget gets its launch probe
duty-cycled, the loop runs on unharmed, and the launch count is extrapolated close to the truth.

The per-hit cost is set high (10 us) and the budget low (1%) so that a loop of 4000 launches/s
is clearly over budget on any machine; what is checked is the mechanism, not this VM's speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_run import agent_cmd, summary, wait_for_earlier_releases

pytestmark = pytest.mark.ebpf

REPO = Path(__file__).resolve().parents[2]
RATE, SECONDS = 4000, 8


@pytest.fixture(scope="module")
def loop_binary(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """benchmarks/call_loop.c built, with the real libcudart and libnccl it calls."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from probe_overhead import build_loop, find_libraries  # noqa: PLC0415

    rt, nccl = find_libraries()
    return [str(build_loop(tmp_path_factory.mktemp("loop"))), rt, nccl]


@pytest.fixture
def call_loop(loop_binary: list[str]) -> list[str]:
    return [*loop_binary, str(RATE * SECONDS), str(RATE)]


def test_an_over_budget_launch_probe_is_cycled_and_its_count_extrapolated(pipeline, call_loop) -> None:  # noqa: ANN001
    wait_for_earlier_releases()
    env = dict(os.environ, OTEL_EACGM_OVERHEAD_BUDGET="0.01", OTEL_EACGM_PROBE_HIT_COST_US="10",
               OTEL_EACGM_GUARDRAIL_PERIOD_S="1", OTEL_EACGM_METRICS_INTERVAL_S="1", OTEL_EACGM_LOG_LEVEL="info")
    cmd = agent_cmd(pipeline.grpc_endpoint, "--launch-layer", "cuda.runtime", "--layers", "cuda.runtime,nccl",
                    "--", *call_loop)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loop = json.loads(proc.stdout.strip().splitlines()[-1])
    made = loop["iterations"] + 1  # the loop's first launch initialises the runtime
    assert "guardrail: probes would cost" in proc.stderr, proc.stderr[-3000:]
    # 4000/s x 10 us = 4% against a 1% budget: the probe is attached about a quarter of the time
    captured = summary(proc.stderr)["calls"]
    assert captured < 0.6 * made, (captured, made)

    def series(name: str) -> list[dict]:
        return [p for p in pipeline.store.metric_points() if p["name"] == name and
                p["attributes"].get("code.function.name") == "cudaLaunchKernel"]

    def launches() -> int:
        points = series("eacgm.calls")
        return max((p["value"] for p in points), default=0)

    assert pipeline.store.wait_for(lambda: series("eacgm.agent.probe.duty"), 10)
    duty = min(p["value"] for p in series("eacgm.agent.probe.duty"))
    assert 0.05 <= duty <= 0.5, duty
    # the statistics divide what was counted by the attached share of each window
    assert pipeline.store.wait_for(lambda: launches() > 0.75 * made, 15), (launches(), made, captured)
    assert launches() < 1.25 * made, (launches(), made)


def test_a_hit_cost_above_the_configured_one_is_measured_from_the_slowdown(pipeline, loop_binary) -> None:  # noqa: ANN001
    """A loop as fast as its probes let it (20 launches and an NCCL group pair per iteration)
    with the hit cost configured at 0.1 us, below what a hit costs on any machine: once its
    launch probe is cycled, the agent measures the cost from how much slower the uncycled NCCL
    calls run while the launches are attached, and uses that. The truth comes from the same
    loop bare and with every probe attached all the time."""
    wait_for_earlier_releases()

    def loop(*agent: str, env: dict | None = None, seconds: str = "3") -> tuple[float, str]:
        cmd = [*agent, "--", *loop_binary, "mixed", "20", seconds] if agent else [*loop_binary, "mixed", "20", seconds]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ, **(env or {})))
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])["iteration_ns"], proc.stderr

    agent = agent_cmd(pipeline.grpc_endpoint, "--launch-layer", "cuda.runtime", "--layers", "cuda.runtime,nccl")
    bare, _ = loop()
    full, _ = loop(*agent, env={"OTEL_EACGM_OVERHEAD_BUDGET": "0"})
    per_hit = (full - bare) * 1e-9 / (20 + 4)  # 20 entry-only launch hits, the pair's entries and returns
    _, log = loop(*agent, env={"OTEL_EACGM_OVERHEAD_BUDGET": "0.05", "OTEL_EACGM_PROBE_HIT_COST_US": "0.1",
                               "OTEL_EACGM_GUARDRAIL_PERIOD_S": "1", "OTEL_EACGM_METRICS_INTERVAL_S": "1",
                               "OTEL_EACGM_LOG_LEVEL": "info"}, seconds="8")
    assert "guardrail: a probe hit costs pid" in log, log[-3000:]

    def costs() -> list[float]:
        return [p["value"] for p in pipeline.store.metric_points() if p["name"] == "eacgm.agent.probe.hit_cost"]

    assert pipeline.store.wait_for(costs, 10)
    assert 0.5 * per_hit < costs()[-1] < 2 * per_hit, (costs(), per_hit)
