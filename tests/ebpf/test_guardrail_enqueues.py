"""The overhead guardrail cycles calls that only enqueue work and have a return probe
(cudaMemsetAsync here, the catalog's ``cyclable`` rows): a steady memset loop over budget gets
its entry and return probes duty-cycled as a pair, its count is extrapolated close to the
calls made, and the pair's detach leaves no call half seen (no frame closed as unwound).

The real libcudart of the nvidia-cuda-runtime wheel runs without a GPU; each memset fails with
a real error code, which its return probe reads. The per-hit cost is set high (10 us) and the
budget low (1%) so that 4000 memsets a second are clearly over it on any machine.
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
LOOP = """
import ctypes, json, sys, time
rt = ctypes.CDLL(sys.argv[1])
rate, seconds = int(sys.argv[2]), float(sys.argv[3])
memset = rt.cudaMemsetAsync
memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
memset(None, 0, 0, None)  # the first call initialises the runtime
n, start = 0, time.monotonic()
codes = set()
while time.monotonic() - start < seconds:
    for _ in range(100):
        codes.add(memset(None, 0, 256, None))
    n += 100
    time.sleep(max(0.0, start + n / rate - time.monotonic()))
print(json.dumps({"memsets": n + 1, "codes": sorted(codes)}))
"""


def test_over_budget_memsets_are_cycled_with_their_returns_and_extrapolated(pipeline) -> None:  # noqa: ANN001
    sys.path.insert(0, str(REPO / "benchmarks"))
    from probe_overhead import find_libraries  # noqa: PLC0415

    libcudart, _ = find_libraries()
    wait_for_earlier_releases()
    env = dict(os.environ, OTEL_EACGM_OVERHEAD_BUDGET="0.01", OTEL_EACGM_PROBE_HIT_COST_US="10",
               OTEL_EACGM_GUARDRAIL_PERIOD_S="1", OTEL_EACGM_METRICS_INTERVAL_S="1", OTEL_EACGM_LOG_LEVEL="info",
               OTEL_EACGM_SPAN_SAMPLE_RATIO="0", OTEL_EACGM_GPU_METRICS="0")
    cmd = agent_cmd(pipeline.grpc_endpoint, "--layers", "cuda.runtime", "--",
                    sys.executable, "-c", LOOP, libcudart, str(RATE), str(SECONDS))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loop = json.loads(proc.stdout.strip().splitlines()[-1])
    made = loop["memsets"]
    assert 0 not in loop["codes"], loop  # no GPU: every memset fails, and its return probe says how
    throttled = [ln for ln in proc.stderr.splitlines() if "guardrail: probes would cost" in ln]
    assert throttled and "cudaMemsetAsync" in throttled[0], proc.stderr[-3000:]
    # 4000/s x 2 hits x 10 us = 8% against a 1% budget: attached about a tenth of the time
    assert summary(proc.stderr)["calls"] < 0.6 * made, (summary(proc.stderr), made)

    def points(name: str) -> list[dict]:
        return [p for p in pipeline.store.metric_points() if p["name"] == name and
                p["attributes"].get("code.function.name") == "cudaMemsetAsync"]

    def counted() -> float:
        return max((p["value"] for p in points("eacgm.calls")), default=0)

    # the statistics divide what was counted by the attached share of each window
    assert pipeline.store.wait_for(lambda: counted() > 0.75 * made, 15), (counted(), made)
    assert counted() < 1.25 * made, (counted(), made)
    errors: dict[str, float] = {}
    for p in points("eacgm.call.errors"):
        kind = p["attributes"].get("error.type")
        errors[kind] = max(errors.get(kind, 0), p["value"])
    # every call's failure was read at its return; none was cut in half by a detach
    assert errors.get("eacgm.exception", 0) < 0.01 * made, errors
    assert sum(v for k, v in errors.items() if k != "eacgm.exception") > 0.75 * made, (errors, made)
