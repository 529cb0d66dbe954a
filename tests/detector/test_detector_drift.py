"""The threshold follows normal drift of an entity's scores downward, never upward, and
never by the windows it flags."""

from __future__ import annotations

import json

import numpy as np
import pytest

from eacgm_testkit.recording import recording
from eacgm_detector.cli import main
from eacgm_detector.config import ConfigError, DetectorConfig
from eacgm_detector.drift import MIN_WINDOWS, DriftThreshold
from eacgm_detector.model import GMMDetector
from eacgm_detector.online import fit_rows, fit_table
from eacgm_detector.pipeline import Detector
from eacgm_detector.persist import load_model, save_model

from test_detector_online import replay


def test_threshold_follows_the_median_of_recent_normal_windows_down_not_up():
    d = DriftThreshold(threshold=-10.0, single_threshold=-40.0, median=5.0, windows=100)
    for _ in range(MIN_WINDOWS - 1):
        d.observe(-15.0, flagged=False)
    assert d.current() == (-10.0, -40.0), "too few windows to judge drift yet"
    d.observe(-15.0, flagged=False)
    assert d.current() == (-30.0, -60.0)  # recent median 20 below the held-out one
    for _ in range(500):
        d.observe(-1e6, flagged=True)  # an anomaly does not lower the bar for itself
    assert d.current() == (-30.0, -60.0)
    for _ in range(100):
        d.observe(50.0, flagged=False)  # scoring better than training: no higher threshold
    assert d.current() == (-10.0, -40.0)


@pytest.mark.parametrize("median,windows", [(None, 100), (5.0, 0)])
def test_no_median_or_no_windows_keeps_the_threshold(median, windows):
    d = DriftThreshold(-10.0, -40.0, median, windows)
    for _ in range(200):
        d.observe(-100.0, flagged=False)
    assert d.current() == (-10.0, -40.0)


def drifting(rng, n: int, shift: float) -> np.ndarray:
    """Two correlated features, the second drifting away from its partner over the first
    third of the windows to ``shift`` standard deviations, and staying there. (A step that
    puts every window below the threshold is not followed: no window that is not flagged
    shows it.)"""
    a = rng.normal(size=n)
    drift = np.minimum(np.arange(n) / (n / 3), 1.0) * shift
    return np.column_stack([a, 0.8 * a + 0.6 * rng.normal(size=n) + drift])


def test_a_drifting_entity_raises_fewer_false_alarms_and_still_flags_a_fault():
    rng = np.random.default_rng(0)
    det = GMMDetector(2, threshold_risk=0.01, random_state=0).fit(drifting(rng, 3000, 0.0))
    test = drifting(rng, 1000, 2.0)
    test[700] = [0.0, 12.0]  # a fault far beyond the drift
    scores = det.score_samples(test)
    fixed = det.anomalies(scores, 1, drift_windows=0)
    followed = det.anomalies(scores, 1, drift_windows=100)
    normal = np.ones(1000, bool)
    normal[700] = False
    assert fixed[normal].mean() > 0.2, "the drift alone makes the fixed threshold flag a fifth"
    # Not all of it: it follows with a lag, and from the windows left above the threshold,
    # whose median lies above that of all normal windows.
    assert followed[normal].mean() < 0.6 * fixed[normal].mean()
    assert fixed[700] and followed[700]
    rules, thresholds = det.rules(scores, 1, drift_windows=100)
    assert thresholds[0] == det.threshold_ and thresholds[-1] < det.threshold_
    assert np.all(thresholds <= det.threshold_)
    assert rules[700] == "threshold"


def test_model_files_keep_the_median_and_older_ones_keep_their_threshold(tmp_path):
    rng = np.random.default_rng(1)
    model = fit_table(DetectorConfig(max_components=2, context_windows=[]), ["a", "b"],
                      drifting(rng, 400, 0.0))
    save_model(tmp_path / "m.npz", model)
    back = load_model(tmp_path / "m.npz").detector
    assert back.holdout_median_ == pytest.approx(np.median(model.detector.holdout_scores_))
    with np.load(tmp_path / "m.npz", allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if k != "meta"}
        meta = json.loads(str(data["meta"]))
    meta["version"] = 3
    del meta["holdout_median"]
    np.savez(tmp_path / "v3.npz", meta=np.array(json.dumps(meta)), **arrays)
    old = load_model(tmp_path / "v3.npz").detector
    assert old.holdout_median_ is None
    scores = np.full(200, old.threshold_ - 1.0)  # all drifted below: all stay flagged
    assert old.anomalies(scores, 1, drift_windows=100).all()
    meta.update(version=4, holdout_median="x")
    np.savez(tmp_path / "bad.npz", meta=np.array(json.dumps(meta)), **arrays)
    with pytest.raises(ValueError, match="holdout_median 'x' must be a finite number"):
        load_model(tmp_path / "bad.npz")


def test_score_writes_the_threshold_each_row_was_compared_with(tmp_path):
    rng = np.random.default_rng(2)
    train, test = drifting(rng, 2000, 0.0), drifting(rng, 600, 1.0)
    for name, X in (("train.csv", train), ("test.csv", test)):
        np.savetxt(tmp_path / name, X, delimiter=",", header="a,b", comments="")
    assert main(["fit", "--input", str(tmp_path / "train.csv"), "--output", str(tmp_path / "m.npz"),
                 "--threshold-risk", "0.01"]) == 0
    flagged = {}
    for drift in ("100", "0"):
        out = tmp_path / f"s{drift}.csv"
        assert main(["score", "--model", str(tmp_path / "m.npz"), "--input", str(tmp_path / "test.csv"),
                     "--output", str(out), "--drift-windows", drift]) == 0
        rows = np.genfromtxt(out, delimiter=",", names=True, dtype=None, encoding="utf-8")
        flagged[drift] = rows["anomaly"].sum()
        if drift == "100":
            assert rows["threshold"][-1] < rows["threshold"][0]
        else:
            assert np.all(rows["threshold"] == rows["threshold"][0])
    assert flagged["100"] < flagged["0"]


def test_drift_windows_must_not_be_negative():
    with pytest.raises(ConfigError, match="drift_windows: -1 must be >= 0"):
        DetectorConfig(drift_windows=-1).validate()


def test_serve_compares_each_window_with_the_threshold_moved_by_drift(monkeypatch):
    cfg = DetectorConfig(window_s=1.0, grace_s=0.5, warmup_windows=10)
    train = Detector(DetectorConfig(window_s=1.0, grace_s=0.5, warmup_windows=10_000, history_windows=10_000))
    replay(train, recording([0], 150, seed=11))
    [ent] = train.entities.values()
    model = fit_rows(cfg, list(ent.history))
    gmm = model.detector
    drop = 10.0  # the entity's normal windows now score this far below the held-out median
    assert gmm.holdout_median_ - drop > gmm.threshold_
    scores = iter([gmm.holdout_median_ - drop] * 40 + [gmm.threshold_ - drop / 2, gmm.threshold_ - 2 * drop])
    monkeypatch.setattr(gmm, "score_samples", lambda X: np.array([next(scores)]))
    results = replay(Detector(cfg, model), recording([0], 42, seed=3))
    assert [r.threshold for r in results[:30]] == [gmm.threshold_] * 30
    assert results[40].threshold == pytest.approx(gmm.threshold_ - drop)
    assert not results[40].anomalous, "drift alone is no anomaly"
    assert results[41].anomalous and results[41].rule == "threshold"
