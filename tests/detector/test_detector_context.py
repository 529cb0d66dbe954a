"""Context features, contiguous folds, the small-sample variance floor, and their model files."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from eacgm_detector.config import DetectorConfig
from eacgm_detector.context import (ContextTracker, add_context, base_name, derived_from,
                                    trimmed_mean)
from eacgm_detector.features import vectorize
from eacgm_detector.model import GMMDetector
from eacgm_detector.online import fit_table, table_features
from eacgm_detector.persist import load_model, save_model


def test_deviation_is_from_the_trimmed_mean_of_the_previous_k_windows():
    X = np.arange(40.0)[:, None] ** 1.5
    Xc, names = add_context(X, ["a"], [4, 10])
    assert names == ["a", "a.dev4", "a.dev10"]
    assert np.isnan(Xc[:4, 1]).all() and np.isnan(Xc[:10, 2]).all(), "needs k earlier windows"
    for t in range(10, 40):
        prev4 = np.sort(X[t - 4:t, 0])[1:-1]  # highest and lowest left out
        assert Xc[t, 1] == pytest.approx(X[t, 0] - prev4.mean())
        prev10 = np.sort(X[t - 10:t, 0])[1:-1]
        assert Xc[t, 2] == pytest.approx(X[t, 0] - prev10.mean())
    assert add_context(X, ["a"], [])[0] is not None and add_context(X, ["a"], [])[1] == ["a"]


def test_trimmed_mean_ignores_nan_and_one_extreme():
    assert trimmed_mean(np.array([1.0, 2.0, 100.0, 3.0, np.nan])) == pytest.approx(2.5)
    assert trimmed_mean(np.array([1.0, 3.0])) == pytest.approx(2.0)  # too few to trim
    assert math.isnan(trimmed_mean(np.array([np.nan, np.nan])))
    thirty = np.r_[np.arange(27.0), 1e6, -1e6, 1e6]
    # A tenth (3) left out at each end: the three wild values go, and the lowest real one.
    assert trimmed_mean(thirty) == pytest.approx(np.arange(1.0, 27.0).mean())


def test_one_wild_window_does_not_echo_into_the_next_ones():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    X[100, 0] = 50.0
    Xc, _ = add_context(X, ["a", "b"], [10, 30])
    assert Xc[100, 2] > 40 and Xc[100, 4] > 40
    # The windows after it compare with the recent past as if it had not happened.
    assert np.abs(Xc[101:131, [2, 4]]).max() < 5


def test_tracker_gives_the_table_values_one_window_at_a_time():
    rng = np.random.default_rng(1)
    rows = []
    for t in range(80):
        row = {"span.l.f.count": float(rng.poisson(5)), "metric.g.mean": float(rng.normal())}
        if t % 7 == 3:
            del row["metric.g.mean"]  # a gauge not reported: skipped in the means
        if t % 11 == 5:
            del row["span.l.f.count"]  # no calls: a true zero
        if 15 <= t < 20:
            row["span.l.once.count"] = 3.0  # a function called for a while, then never again
        rows.append(row)
    tracker = ContextTracker([10, 30])
    online = [tracker.augment(r) for r in rows]
    names = ["metric.g.mean", "span.l.f.count", "span.l.once.count"]
    Xc, names_c = add_context(vectorize(rows, names), names, [10, 30])
    got = vectorize(online, names_c)
    # Before its first call the tracker cannot know the function (the table can): unknown.
    before = [names_c.index(f"span.l.once.count.dev{k}") for k in (10, 30)]
    assert np.isnan(got[:15, before]).all()
    Xc[:15, before] = np.nan
    assert np.allclose(got, Xc, equal_nan=True)
    assert "span.l.f.count.dev10" not in online[9] and "span.l.f.count.dev10" in online[10]
    assert online[79]["span.l.once.count.dev30"] == 0.0  # no calls, as in the last 30 windows


def test_names_and_bases():
    names = ["a.count", "a.count.dev10", "b.dev30", "c.dev7"]
    assert [base_name(n, (10, 30)) for n in names] == ["a.count", "a.count", "b", "c.dev7"]
    assert derived_from(names, (10, 30)) == [-1, 0, -1, -1]  # b is not a feature: plain


def test_missing_deviation_reads_as_the_usual_level():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(2000, 3)).cumsum(axis=0) * 0.05 + rng.normal(size=(2000, 3))
    Xc, names = add_context(X, ["a", "b", "c"], [10])
    det = GMMDetector(3, random_state=0, derived_from=derived_from(names, [10])).fit(Xc)
    # A first window (no earlier ones) at an ordinary level is normal, at a wild one is not.
    usual = np.r_[X.mean(axis=0), [np.nan] * 3][None]
    wild = np.r_[X.mean(axis=0) + [0, 0, 40], [np.nan] * 3][None]
    assert det.predict(usual)[0] == 1 and det.predict(wild)[0] == -1
    with pytest.raises(ValueError, match="derived_from="):
        GMMDetector(derived_from=[-1, 5]).fit(np.zeros((20, 2)))
    with pytest.raises(ValueError, match="derived_from="):
        GMMDetector(derived_from=[1, 0]).fit(np.zeros((20, 2)))  # a deviation of a deviation


def test_contiguous_folds_see_drift_that_random_folds_hide():
    rng = np.random.default_rng(3)
    t = np.arange(3000)
    X = np.column_stack([np.sin(t / 400) * 3, np.cos(t / 300) * 3]) + rng.normal(size=(3000, 2)) * 0.3
    contiguous = GMMDetector(4, random_state=0).fit(X)
    shuffled = GMMDetector(4, random_state=0, shuffle_folds=True).fit(X)
    # Held-out blocks are parts of the cycle the rest hardly covers: a more cautious threshold.
    assert contiguous.threshold_ < shuffled.threshold_


def test_short_fit_in_many_dimensions_stays_sensitive_and_constants_strict():
    rng = np.random.default_rng(4)
    mix = rng.normal(size=(18, 18)) / 4 + np.eye(18)

    def windows(n, shift=0.0):
        X = np.hstack([rng.normal(size=(n, 18)) @ mix, np.zeros((n, 1))])  # last: constant
        X[n // 2:, :3] += shift
        return add_context(X, [f"f{j}" for j in range(19)], [10, 30])[0]
    # 57 features, 200 windows: without the d/n variance floor the held-out scores are so
    # poor that the threshold sits far below anything (this shift went unflagged).
    det = GMMDetector(4, random_state=0).fit(windows(200))
    new = windows(2000, shift=6.0)
    assert (det.predict(new[30:1000]) == -1).mean() < 0.01
    assert (det.predict(new[1030:]) == -1).mean() > 0.9
    changed = new[30:80].copy()
    changed[:, 18] = 1.0  # the feature that never moved in training moves
    assert (det.predict(changed) == -1).all()


def test_context_model_round_trip_and_table_scoring(tmp_path):
    rng = np.random.default_rng(5)
    names = ["x", "y"]
    train = rng.normal(size=(500, 2)).cumsum(axis=0) * 0.02 + rng.normal(size=(500, 2))
    model = fit_table(DetectorConfig(max_components=2, context_windows=[5, 20]), names, train)
    assert model.context_windows == (5, 20) and model.base_feature_names == names
    assert model.detector.derived_from == [-1, -1, 0, 1, 0, 1]
    save_model(tmp_path / "m.npz", model)
    back = load_model(tmp_path / "m.npz")
    assert back.context_windows == (5, 20) and back.feature_names == model.feature_names
    test = rng.normal(size=(60, 2))
    # Columns in another order, and one missing: matched by name, the missing one imputed.
    X1, missing = table_features(back, ["y", "x"], test[:, ::-1])
    X0, _ = table_features(model, names, test)
    assert missing == [] and np.allclose(X1, X0, equal_nan=True)
    assert np.allclose(back.detector.score_samples(X1), model.detector.score_samples(X0))
    _, missing = table_features(back, ["x"], test[:, :1])
    assert missing == ["y"]


def test_version_1_model_files_still_load_without_context(tmp_path):
    rng = np.random.default_rng(6)
    model = fit_table(DetectorConfig(max_components=2, context_windows=[]), ["a", "b"],
                      rng.normal(size=(300, 2)))
    save_model(tmp_path / "m.npz", model)
    with np.load(tmp_path / "m.npz", allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if k != "meta"}
        meta = json.loads(str(data["meta"]))
    meta["version"] = 1
    del meta["context_windows"], meta["single_threshold"]
    for key in ("shuffle_folds", "derived_from", "spike_floor"):
        del meta["params"][key]
    np.savez(tmp_path / "v1.npz", meta=np.array(json.dumps(meta)), **arrays)
    back = load_model(tmp_path / "v1.npz")
    assert back.context_windows == () and back.feature_names == ["a", "b"]
    assert back.detector.spike_floor == 0.0  # fitted before the floor existed
    # before version 3 every window below the threshold was an anomaly on its own
    assert back.detector.single_threshold_ == back.detector.threshold_
    meta.update(version=2, context_windows=[0])
    np.savez(tmp_path / "bad.npz", meta=np.array(json.dumps(meta)), **arrays)
    with pytest.raises(ValueError, match="bad.npz"):
        load_model(tmp_path / "bad.npz")


@pytest.mark.parametrize("value,match", [
    ([0], "context_windows: 0 is not a window count >= 1"),
    ("10", "context_windows: '10' is not a valid list"),
    ([True], "context_windows: \\[True\\] is not a valid list"),
])
def test_config_context_windows_validated(value, match):
    with pytest.raises(ValueError, match=match):
        DetectorConfig(context_windows=value).validate()
    assert DetectorConfig(context_windows=[]).validate().context_windows == []


def _level_walk(rng: np.random.Generator, n: int, d: int = 4) -> np.ndarray:
    """Metrics whose level wanders slowly over a wide range, with small window-to-window noise:
    a normal series may start at any level the training windows visited."""
    t = np.arange(n)[:, None]
    return 10 * np.sin(2 * np.pi * t / 1500 + np.arange(d)) + 0.3 * rng.normal(size=(n, d))


def test_a_series_that_starts_away_from_the_training_mean_is_not_flagged_at_its_start():
    # The defect: the first 30 windows of a scored series were flagged because their
    # missing deviations read as "the level minus the training mean", a jump as large as the
    # level's whole range, although the series was steady from its first window on.
    rng = np.random.default_rng(11)
    names = [f"m{j}" for j in range(4)]
    train = _level_walk(rng, 6000)
    model = fit_table(DetectorConfig(random_state=0), names, train)
    for start in (300, 1100):  # levels near the top and the bottom of the sine, far from its mean
        test = _level_walk(rng, 6000)[start:start + 200]
        X, _ = table_features(model, names, test)
        flags = model.detector.anomalies(model.detector.score_samples(X), 2)
        assert not flags[:30].any(), (start, np.flatnonzero(flags[:30]))
        # ... while a jump at the start of a series is still one.
        test[:40, 0] += 8
        X, _ = table_features(model, names, test)
        assert model.detector.anomalies(model.detector.score_samples(X), 2)[:30].sum() > 20
