"""The paired overhead benchmark's arithmetic: steps placed in the blocks between switches,
straddling steps dropped, each paused block against its traced neighbours."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from overhead_paired import blocks_of, geo_mean_ci, last_duty, pair_ratios  # noqa: E402

MS = 1_000_000


def test_steps_overlapping_a_switch_are_dropped() -> None:
    switches = [{"state": "paused", "start_ns": 100 * MS, "end_ns": 110 * MS},
                {"state": "traced", "start_ns": 200 * MS, "end_ns": 210 * MS}]
    steps = [[0, 50 * MS], [60 * MS, 105 * MS], [120 * MS, 150 * MS], [160 * MS, 205 * MS], [215 * MS, 300 * MS]]
    assert blocks_of(steps, switches) == [("traced", [50.0]), ("paused", [30.0]), ("traced", [85.0])]


def test_a_paused_block_is_compared_with_the_mean_of_its_traced_neighbours() -> None:
    # a host that slows down linearly: 10, 11 (paused), 12 ms; traced 10% slower than paused
    blocks = [("traced", [11.0] * 3), ("paused", [11.0] * 3), ("traced", [13.2] * 3), ("paused", [1.0])]
    assert pair_ratios(blocks) == [pytest.approx((11.0 + 13.2) / 2 / 11.0)]  # the 1-step block is too short


def test_geo_mean_interval_holds_the_mean_and_narrows_with_agreeing_pairs() -> None:
    mean, low, high = geo_mean_ci([1.02, 1.04, 1.03, 1.05, 1.01])
    assert low <= mean <= high and high - low < 0.04
    assert geo_mean_ci([1.0, 1.0, 1.0]) == (pytest.approx(1.0), pytest.approx(1.0), pytest.approx(1.0))


def test_last_duty_reads_the_guardrails_last_decision() -> None:
    lines = ["probes would cost 9.0% (budget 5.0%): launches attached 40% of each 2 s, their statistics extrapolated",
             "estimated probe cost 3.0% is within the budget again: launches attached all the time",
             "probes would cost 12.0% (budget 5.0%): launches attached 12% of each 2.1 s"]
    assert last_duty(lines) == 0.12 and last_duty(lines[:2]) == 1.0 and last_duty([]) == 1.0
