"""The paired overhead measurement's pause cycle (otel_eacgm/pause_cycle.py) on real probes: a
loop of failing cudaFree calls is traced in the traced blocks the pause log names, and not in
the paused ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_run import agent_cmd, summary

pytestmark = pytest.mark.ebpf

LOOP = """
import ctypes, json, time
from pathlib import Path
import nvidia.cu13
rt = ctypes.CDLL(str(Path(list(nvidia.cu13.__path__)[0]) / "lib" / "libcudart.so.13"))
times, end = [], time.monotonic() + 5
while time.monotonic() < end:
    times.append(time.monotonic_ns())
    rt.cudaFree(ctypes.c_void_p(0x7000))
    time.sleep(0.0005)
print(json.dumps(times))
"""


def test_calls_are_traced_in_traced_blocks_only(pipeline, tmp_path: Path) -> None:  # noqa: ANN001
    log = tmp_path / "pauses.jsonl"
    env = dict(os.environ, OTEL_EACGM_PAUSE_CYCLE_S="0.5", OTEL_EACGM_PAUSE_CYCLE_LOG=str(log),
               OTEL_EACGM_OVERHEAD_BUDGET="0", OTEL_EACGM_GPU_METRICS="0")
    cmd = agent_cmd(pipeline.grpc_endpoint, "--layers", "cuda.runtime", "--", sys.executable, "-c", LOOP)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    times = json.loads(proc.stdout.strip().splitlines()[-1])
    switches = [json.loads(line) for line in log.read_text().splitlines()]
    states = [s["state"] for s in switches]
    assert len(switches) >= 4 and states[::2] == ["paused"] * len(states[::2]) and \
        states[1::2] == ["traced"] * len(states[1::2]), switches
    assert sum(s["probes"] > 0 for s in switches) >= 4, switches  # the first may come before libcudart loads

    # a call is in a paused block between a pause's end and the next resume's start, traced
    # outside [pause start, resume end]; the switches themselves are ambiguous
    paused = traced = 0
    for t in times:
        ambiguous = any(s["start_ns"] <= t <= s["end_ns"] for s in switches)
        inside = any(p["end_ns"] < t < (r["start_ns"] if r else float("inf"))
                     for p, r in zip(switches[::2], [*switches[1::2], None]))
        if ambiguous:
            continue
        paused += inside
        traced += not inside
    done = summary(proc.stderr)
    assert paused > 0.2 * len(times), (paused, len(times))
    assert traced <= done["calls"] <= len(times) - paused, (traced, done, paused, len(times))
    # returns of calls entered while paused are the pause's, not unmatched ones
    assert done["unmatched_returns"] <= 2, done
