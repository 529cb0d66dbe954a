"""overhead_ab.py --merge: rounds of several runs (device commands) analysed as one run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import overhead_ab  # noqa: E402

SLOWDOWN = {"untraced": 1.0, "agent_default": 1.1, "agent_full": 1.5, "profiler": 1.3}


def fake_run(out: Path, step_ms: float, rounds: int) -> Path:
    """An overhead_ab.json as a run of `rounds` rounds writes it, every block of `step_ms` steps x SLOWDOWN."""
    blocks, attaches = [], []
    for r in range(rounds):
        for cfg, slow in SLOWDOWN.items():
            ms = step_ms * slow
            b = {"round": r, "config": cfg, "workload": "gpt_launch", "times_ms": [ms] * 10, "steps": 10,
                 "median_ms": ms, "throughput_steps_s": 1e3 / ms, "t0_ns": 0, "t1_ns": 1, "wall_s": ms / 100,
                 "leftover_probes": False, "settle_ms": []}
            if cfg == "agent_full":
                b.update(spans=100, launches=50, kernel_calls_per_step=300.0, kernel_launches_per_step=160.0)
            blocks.append(b)
            if cfg.startswith("agent"):
                attaches.append({"round": r, "config": cfg, "done": {"calls": 1, "dropped_ringbuf": 0}, "stop_s": 0.5,
                                 "release_wait_s": 0.0, "released": True, "launches_counted": 900 if cfg == "agent_default" else 1000})
    args = {"rounds": rounds, "configs": ",".join(SLOWDOWN), "workloads": ["gpt_launch"], "steps": {"gpt_launch": 10},
            "skip_steps": 0}
    out.mkdir()
    (out / "overhead_ab.json").write_text(json.dumps({"args": args, "workload": {"device": "cuda:0"},
                                                       "blocks": blocks, "attaches": attaches}))
    return out


def test_merged_runs_give_one_analysis_over_all_their_rounds(tmp_path: Path) -> None:
    a = fake_run(tmp_path / "a", 20.0, rounds=2)
    b = fake_run(tmp_path / "b", 30.0, rounds=1)  # a slower command: its ratios are the same
    overhead_ab.merge([a, b], tmp_path / "m")
    result = json.loads((tmp_path / "m" / "overhead_ab.json").read_text())
    rows = {r["config"]: r for r in result["rows"]}
    assert {r["rounds"] for r in rows.values()} == {3}
    assert rows["agent_default"]["ratio"] == rows["agent_default"]["ratio_max"] == 1.1
    assert rows["agent_full"]["calls_per_step"] == 300.0  # from the in-kernel counts, not the spans
    assert result["extrapolation_error"]["rounds"] == 3
    assert "3 interleaved rounds" in (tmp_path / "m" / "overhead_ab.md").read_text()


def test_calls_per_step_are_counted_per_function_and_the_uncycled_ones_listed() -> None:
    """Cumulative eacgm.calls points around a block of 10 steps give each function's calls per
    step; launches, operators and memsets (cycled by the guardrail) are left out of the
    uncycled list."""
    s = 1_000_000_000
    block = {"workload": "gpt_launch", "config": "agent_full", "t0_ns": 10 * s, "t1_ns": 20 * s, "steps": 10,
             "settle_ms": []}

    def key(layer: str, fn: str) -> tuple:
        return tuple(sorted({"eacgm.layer": layer, "code.function.name": fn, "process.pid": "7"}.items()))

    series = {  # (time, cumulative count): exported before the block, then after it (+1 s of export lag)
        key("cuda.driver", "cuLaunchKernel"): [(9 * s, 1000.0), (22 * s, 1000.0 + 10 * 500)],
        key("torch", "aten::mm"): [(9 * s, 50.0), (22 * s, 50.0 + 10 * 40)],
        key("cuda.runtime", "cudaMemcpyAsync"): [(9 * s, 3.0), (22 * s, 3.0 + 10 * 25)],
        key("nccl", "ncclAllReduce"): [(9 * s, 1.0), (22 * s, 1.0 + 10 * 1)],
        key("cuda.runtime", "cudaMemsetAsync"): [(9 * s, 5.0), (22 * s, 5.0 + 10 * 58)],  # cyclable since 2026-12-06
        key("cuda.runtime", "cudaStreamSynchronize"): [(9 * s, 7.0), (22 * s, 7.0)],  # none in the block
    }
    overhead_ab.kernel_counts(series, [block])
    assert block["kernel_calls_per_step"] == 624 and block["kernel_launches_per_step"] == 500
    assert block["kernel_calls_by_function"]["cuda.runtime cudaMemcpyAsync"] == 25
    assert "cuda.runtime cudaStreamSynchronize" not in block["kernel_calls_by_function"]
    assert overhead_ab.uncycled_calls([block], ["gpt_launch"]) == [
        ["gpt_launch", "cuda.runtime cudaMemcpyAsync", 25.0], ["gpt_launch", "nccl ncclAllReduce", 1.0]]
