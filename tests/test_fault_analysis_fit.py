"""The fault benchmark's analysis on real detector fits: which model scores which run.

Synthetic recordings (eacgm_testkit/recording.py, the agent's attribute names): two
ordinary clean runs, a third clean run whose GPU ran at another level throughout (the kind of
difference one process shows from another), and a fault run at that same level. Fitted on the
first clean run only, both the odd clean run and the fault run look anomalous. Fitted on every
clean run, leave one run out, the odd clean run is still scored by a model that never saw it,
and the fault run by one that did.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from eacgm_testkit.recording import T0, SEC, window_requests  # noqa: E402
from fault_analysis import analyse, load_recordings  # noqa: E402

from eacgm_detector.replay import otlp_json_line  # noqa: E402

WINDOWS = 40


def record_run(runs: Path, name: str, seed: int, anomaly: str | None, lead_in: str | None = None) -> dict:
    """One run's spans and metrics recordings, and its runs.json entry. With ``lead_in`` (an
    anomaly) the recording starts with one more window before the measured span, holding it."""
    rng = np.random.default_rng(seed)
    lead = 1 if lead_in else 0
    with open(runs / f"{name}.spans.jsonl", "w") as spans, open(runs / f"{name}.metrics.jsonl", "w") as metrics:
        for w in range(WINDOWS + lead):
            tr, mt = window_requests(0, w, rng, lead_in if w < lead else anomaly)
            spans.write(otlp_json_line(tr))
            metrics.write(otlp_json_line(mt))
    lo = T0 + lead * SEC
    return {"name": name, "fault": "straggler" if name == "straggler" else None, "steps": 100,
            "step_ms_median": 10.0, "step_ms_p95": 11.0, "fault_every": None, "spans": 1, "points": 1,
            "windows": WINDOWS, "lo_ns": lo, "hi_ns": lo + WINDOWS * SEC}


def recorded(folder: Path) -> Path:
    (folder / "runs").mkdir(parents=True)
    runs = [record_run(folder / "runs", "clean-train", 1, None),
            record_run(folder / "runs", "clean-heldout-1", 2, None),
            record_run(folder / "runs", "clean-heldout-2", 3, "gpu"),
            record_run(folder / "runs", "straggler", 4, "gpu")]
    (folder / "runs.json").write_text(json.dumps({
        "runs": runs, "agent": {"done": {}, "stop_s": 0.1}, "agent_ready_s": 1.0,
        "args": {"device": "cpu", "train_args": "--dim 8", "window_s": 1.0, "metrics_interval_s": "1",
                 "agent_env": []}}))
    return folder


def flagged(folder: Path, fit_on: str) -> dict[str, int]:
    args = argparse.Namespace(out=folder, window_s=1.0, covariance_type=None, threshold_risk=None, fit_on=fit_on)
    meta, runs = load_recordings(folder, [])
    _, result = analyse(args, meta, runs)
    return {r["name"]: r["flagged_windows_any"] for r in result["results"]}


def test_leave_one_run_out_scores_each_clean_run_with_a_model_that_never_saw_it(tmp_path):
    folder = recorded(tmp_path / "fd")
    one = flagged(folder, "clean-train")
    assert "clean-train" not in one  # the run it was fitted on is not scored
    assert one["clean-heldout-2"] > WINDOWS / 2 and one["straggler"] > WINDOWS / 2, one
    every = flagged(folder, "clean-runs")
    assert set(every) == {"clean-train", "clean-heldout-1", "clean-heldout-2", "straggler"}
    # the odd clean run was not in the model that scored it, the fault run's twin was in its model
    assert every["clean-heldout-2"] > WINDOWS / 2, every
    assert every["straggler"] < WINDOWS / 4, every
    assert every["clean-train"] < WINDOWS / 4 and every["clean-heldout-1"] < WINDOWS / 4, every


def test_score_files_hold_what_a_decision_rule_needs(tmp_path):
    """Each window's thresholds and run below the threshold: enough to re-decide it from the file."""
    folder = recorded(tmp_path / "fd")
    flagged(folder, "clean-runs")
    rows = list(csv.DictReader(open(folder / "scores" / "clean-heldout-2.csv")))  # the odd run: flagged
    assert rows and any(r["anomaly"] == "1" for r in rows)
    for model in ("spans", "metrics"):
        run = 0
        for r in (r for r in rows if r["model"] == model):
            score, threshold, single = float(r["score"]), float(r["threshold"]), float(r["single_threshold"])
            run = run + 1 if score < threshold else 0
            assert int(r["below"]) == run, r
            assert (r["anomaly"] == "1") == (score < threshold and (run >= 2 or score < single)), r


def test_a_lead_in_window_is_scored_but_not_counted(tmp_path):
    """fault_detection records metrics from one window before the measured span (a counter's
    rate needs the point before a window): that window is scored, as a live detector would
    score it, and left out of the run's windows, flags and false alarms."""
    folder = recorded(tmp_path / "fd")
    meta = json.loads((folder / "runs.json").read_text())
    meta["runs"][1] = record_run(folder / "runs", "clean-heldout-1", 2, None, lead_in="gpu")
    (folder / "runs.json").write_text(json.dumps(meta))
    args = argparse.Namespace(out=folder, window_s=1.0, covariance_type=None, threshold_risk=None, fit_on="clean-train")
    _, result = analyse(args, *load_recordings(folder, []))
    run = next(r for r in result["results"] if r["name"] == "clean-heldout-1")
    rows = list(csv.DictReader(open(folder / "scores" / "clean-heldout-1.csv")))
    lead = [r for r in rows if r["measured"] == "0"]
    assert lead and all(int(r["timestamp"]) < run["lo_ns"] for r in lead)
    assert any(r["anomaly"] == "1" for r in lead), lead  # the lead-in window alone is anomalous
    assert run["per_model"]["metrics"]["scored"] == WINDOWS and run["flagged_windows_any"] == 0, run
