"""A sampled slice sends at most span_slice_max calls of its thread: a fast launch loop, all of
whose slices are in the sample, leaves the rest of each slice counted and not sent, with no
ring-buffer drop and every call in the statistics."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_run import agent_cmd, summary

pytestmark = pytest.mark.ebpf

REPO = Path(__file__).resolve().parents[2]
RATE, SECONDS, CAP = 10_000, 2, 500


@pytest.fixture(scope="module")
def call_loop(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from probe_overhead import build_loop, find_libraries  # noqa: PLC0415

    rt, nccl = find_libraries()
    return [str(build_loop(tmp_path_factory.mktemp("loop"))), rt, nccl, str(RATE * SECONDS), str(RATE)]


def test_a_sampled_slice_sends_at_most_its_cap(pipeline, call_loop) -> None:  # noqa: ANN001
    env = dict(os.environ, OTEL_EACGM_SPAN_SAMPLE_RATIO="0.9999", OTEL_EACGM_SPAN_SLICE_MAX=str(CAP),
               OTEL_EACGM_OVERHEAD_BUDGET="0", OTEL_EACGM_METRICS_INTERVAL_S="1")
    cmd = agent_cmd(pipeline.grpc_endpoint, "--launch-layer", "cuda.runtime", "--layers", "cuda.runtime,nccl",
                    "--", *call_loop)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    made = RATE * SECONDS + 1  # the loop's first launch initialises the runtime
    counters = summary(proc.stderr)
    assert counters["calls"] == made, counters
    assert counters["dropped_ringbuf"] == 0, counters
    # the loop's 2 s touch at most 4 one-second slices (its thread's first slice begins earlier)
    assert CAP <= counters["received"] <= 4 * CAP, counters
    assert counters["sampled_out"] >= made - 4 * CAP, counters

    def launches() -> float:
        return max((p["value"] for p in pipeline.store.metric_points() if p["name"] == "eacgm.calls" and
                    p["attributes"].get("code.function.name") == "cudaLaunchKernel"), default=0)

    assert pipeline.store.wait_for(lambda: launches() >= made, 15), launches()  # every call counted
