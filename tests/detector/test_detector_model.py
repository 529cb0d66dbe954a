"""GMMDetector: sklearn contract, BIC choice, threshold, imputation, attribution, persistence."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.mixture import GaussianMixture
from sklearn.utils.estimator_checks import parametrize_with_checks

from eacgm_detector.model import RELATIVE_RESOLUTION, GMMDetector
from eacgm_detector.persist import SavedModel, load_model, save_model
from eacgm_detector.threshold import pot_threshold, quantile_threshold


# The outlier checks demand that some training samples are flagged; a 5% quantile threshold
# guarantees that on their small data sets while exercising the same code paths.
@parametrize_with_checks([GMMDetector(3, threshold_method="quantile", threshold_risk=0.05)])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def blobs(n: int, rng) -> np.ndarray:
    """Three modes, visited in random order (held-out folds are contiguous runs of rows)."""
    centers = np.array([[0, 0, 0, 0], [6, 6, 0, 0], [0, 6, 6, 6]], float)
    return rng.permutation(np.vstack([c + rng.normal(size=(n, 4)) for c in centers]))


def test_bic_chooses_the_true_number_of_components():
    det = GMMDetector(6, random_state=0).fit(blobs(200, np.random.default_rng(0)))
    assert det.n_components_ == 3
    assert det.bic_.argmin() == 2
    # The choice was checked on held-out windows: the 3-component fit generalises best too.
    assert det.holdout_log_likelihood_.shape == det.bic_.shape
    assert det.holdout_log_likelihood_.argmax() == 2


def test_component_search_respects_the_cap():
    X = blobs(200, np.random.default_rng(6))
    assert GMMDetector(2, random_state=0).fit(X).n_components_ <= 2
    assert GMMDetector(1, random_state=0).fit(X).bic_.shape == (1,)


def test_a_refresh_fits_the_size_given_without_searching():
    X = blobs(200, np.random.default_rng(0))
    det = GMMDetector(6, random_state=0).fit(X, n_components=2)
    assert det.n_components_ == 2 and det.bic_.shape == (1,)
    assert GMMDetector(2, random_state=0).fit(X, n_components=5).n_components_ == 2  # the cap holds


def test_a_fit_on_more_windows_than_the_cap_samples_them_and_scores_every_one(monkeypatch):
    rng = np.random.default_rng(4)
    X = blobs(1500, rng)
    seen = []
    fit = GaussianMixture.fit
    monkeypatch.setattr(GaussianMixture, "fit", lambda self, Z, y=None: seen.append(len(Z)) or fit(self, Z))
    capped = GMMDetector(6, random_state=0, max_fit_windows=300).fit(X)
    assert seen and max(seen) == 300  # every EM run on the sample
    assert capped.holdout_scores_.shape == (X.shape[0],)  # every window scored out of fold
    monkeypatch.setattr(GaussianMixture, "fit", fit)
    full = GMMDetector(6, random_state=0).fit(X)
    assert capped.n_components_ == full.n_components_ == 3
    test = blobs(300, rng)
    # 300 of 3,600 training windows: the same modes, scores that agree (0.96 measured).
    assert np.corrcoef(capped.score_samples(test), full.score_samples(test))[0, 1] > 0.95
    with pytest.raises(ValueError, match="max_fit_windows=1"):
        GMMDetector(max_fit_windows=1).fit(X)


def test_threshold_flags_outliers_not_normal_points():
    rng = np.random.default_rng(1)
    det = GMMDetector(6, random_state=0).fit(blobs(300, rng))
    normal = blobs(100, rng)
    far = normal[:20] + np.array([0, 0, 12, -12])
    assert (det.predict(normal) == 1).mean() > 0.99
    assert (det.predict(far) == -1).all()
    assert det.threshold_method_ == "pot"
    assert np.allclose(det.decision_function(far), det.score_samples(far) - det.threshold_)


def test_constant_and_missing_features_are_handled():
    rng = np.random.default_rng(2)
    X = np.column_stack([rng.normal(size=400), np.full(400, 5.0), rng.normal(size=400)])
    X[rng.random(400) < 0.2, 2] = np.nan
    det = GMMDetector(3, random_state=0).fit(X)
    assert np.isfinite(det.score_samples(X)).all()
    # A missing value is imputed, so a row with NaN scores like a typical row.
    assert det.predict(np.array([[0.0, 5.0, np.nan]]))[0] == 1
    assert det.predict(np.array([[0.0, 9.0, 0.0]]))[0] == -1


def test_contributions_name_the_feature_that_moved():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(500, 5))
    det = GMMDetector(2, random_state=0).fit(X)
    x = np.zeros((1, 5))
    x[0, 3] = 9.0
    assert det.contributions(x)[0].argmax() == 3


def test_a_gauge_still_in_training_does_not_outrank_a_feature_that_moved():
    # A GPU memory gauge that sat at 6.5 GB through training and then grew by 2 MiB, beside a
    # latency that moved by 8 of its standard deviations: the latency is what changed.
    rng = np.random.default_rng(4)
    X = np.column_stack([np.full(300, 6.5e9), rng.normal(size=300), rng.normal(size=300)])
    det = GMMDetector(1, random_state=0).fit(X)
    c = det.contributions(np.array([[6.5e9 + 2 * 2**20, 8.0, 0.0]]))[0]
    assert c.argmax() == 1
    # Its resolution is a share of its level, not of reg_covar in bytes; a real change of
    # it (a tenth of its level) still stands out.
    assert det.scale_[0] == pytest.approx(6.5e9 * RELATIVE_RESOLUTION)
    assert det.predict(np.array([[7.2e9, 0.0, 0.0]]))[0] == -1


def test_resolution_of_logarithms_context_features_and_zeros():
    rng = np.random.default_rng(5)
    n = 300
    level = np.full(n, 1e6)
    log_feature = np.full(n, -20.0)  # a log of seconds: its level depends on the unit
    zero = np.zeros(n)  # a function never called in training
    X = np.column_stack([level, np.zeros(n), log_feature, zero, rng.normal(size=n)])
    det = GMMDetector(1, derived_from=[-1, 0, -1, -1, -1],
                      logarithmic=[False, False, True, False, False], random_state=0).fit(X)
    # A context feature (a deviation, centred on 0) is resolved like the feature it comes from.
    assert det.scale_[1] == det.scale_[0] == pytest.approx(1e6 * RELATIVE_RESOLUTION)
    assert det.scale_[2] == pytest.approx(np.log1p(RELATIVE_RESOLUTION))
    # A feature constant at 0 has no level: any change of it stays news.
    assert det.scale_[3] < 1.0
    assert det.predict(np.array([[1e6, 0.0, -20.0, 1.0, 0.0]]))[0] == -1
    with pytest.raises(ValueError, match="logarithmic=.*expected 5 booleans"):
        GMMDetector(1, logarithmic=[True]).fit(X)


def spiky_windows(n: int, rng) -> np.ndarray:
    """A latency beside a counter that is 0 in 95 % of the windows and 5 to 10 in the rest."""
    spikes = np.where(rng.random(n) < 0.05, rng.uniform(5, 10, n), 0.0)
    return np.column_stack([rng.normal(size=n), spikes, np.zeros(n)])


def test_spike_floor_widens_spiky_features_only():
    rng = np.random.default_rng(6)
    X = spiky_windows(2000, rng)
    tight = GMMDetector(3, spike_floor=0.0, random_state=0).fit(X)
    floored = GMMDetector(3, spike_floor=3.0, random_state=0).fit(X)
    # A small count where training had 0 (a blip of 1.5, beside spikes of 5 to 10) is tens of
    # log-likelihood units down under the component at 0 of the tight mixture, not with the
    # floor; a spike far beyond training and a latency 8 standard deviations off still are.
    blip, huge, slow = [0.0, 1.5, 0.0], [0.0, 60.0, 0.0], [8.0, 0.0, 0.0]
    assert tight.predict(np.array([blip]))[0] == -1
    assert floored.predict(np.array([blip, huge, slow])).tolist() == [1, -1, -1]
    # Only the spiky feature's unit changes; the latency's and the constant's are as before.
    assert floored.scale_[1] > 5 * tight.scale_[1]
    assert floored.scale_[[0, 2]] == pytest.approx(tight.scale_[[0, 2]])
    changed = np.array([[0.0, 0.0, 1.0]])  # the feature that never moved in training moves
    assert floored.predict(changed)[0] == -1


def test_invalid_parameters_are_named():
    with pytest.raises(ValueError, match="covariance_type='bogus'"):
        GMMDetector(covariance_type="bogus").fit(np.zeros((20, 2)))
    with pytest.raises(ValueError, match="threshold_risk=2"):
        GMMDetector(threshold_risk=2).fit(np.zeros((20, 2)))
    with pytest.raises(ValueError, match="spike_floor=-1"):
        GMMDetector(spike_floor=-1).fit(np.zeros((20, 2)))


def test_single_window_threshold_lies_three_times_as_far_below_the_typical_window():
    rng = np.random.default_rng(8)
    det = GMMDetector(3, random_state=0).fit(blobs(400, rng))
    typical = float(np.median(det.score_samples(blobs(400, rng))))
    gap = (typical - det.single_threshold_) / (typical - det.threshold_)
    assert 2.5 < gap < 3.5  # 3 against the held-out median, estimated here on fresh windows


def test_consecutive_windows_below_the_threshold_make_an_anomaly_or_one_far_below():
    det = GMMDetector(3, random_state=0).fit(blobs(400, np.random.default_rng(8)))
    t, single = det.threshold_, det.single_threshold_
    normal, below, far = t + 1.0, (t + single) / 2, single - 1.0
    scores = np.array([normal, below, normal, below, below, below, normal, far, normal])
    assert det.anomalies(scores, 2).tolist() == [0, 0, 0, 0, 1, 1, 0, 1, 0]
    assert det.anomalies(scores, 3).tolist() == [0, 0, 0, 0, 0, 1, 0, 1, 0]
    assert det.anomalies(scores, 1).tolist() == (scores < t).tolist()


def test_thresholds_on_known_distribution():
    rng = np.random.default_rng(4)
    scores = -rng.exponential(1.0, 5000)  # -score ~ Exp(1): the 1e-3 quantile is ln(1000)
    t, method = pot_threshold(scores, 1e-3)
    assert method == "pot" and abs(-t - np.log(1000)) < 0.7
    assert abs(-quantile_threshold(scores, 0.01) - np.log(100)) < 0.3


@pytest.mark.parametrize("cov", ["full", "tied", "diag", "spherical"])
def test_save_load_round_trip(tmp_path, cov):
    rng = np.random.default_rng(5)
    X = blobs(100, rng)
    det = GMMDetector(4, covariance_type=cov, random_state=0).fit(X)
    save_model(tmp_path / "m.npz", SavedModel(det, ["a", "b", "c", "d"]))
    back = load_model(tmp_path / "m.npz")
    assert back.feature_names == ["a", "b", "c", "d"]
    assert np.allclose(back.detector.score_samples(X), det.score_samples(X))
    assert np.allclose(back.detector.contributions(X), det.contributions(X))
    assert back.detector.threshold_ == det.threshold_
    assert back.detector.single_threshold_ == det.single_threshold_ < det.threshold_


def test_load_refuses_pickles_and_junk(tmp_path):
    obj = tmp_path / "evil.npz"
    np.savez(obj, meta=np.array([{"format": "x"}], dtype=object))
    with pytest.raises(ValueError, match="not a detector model file"):
        load_model(obj)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a detector model file"):
        load_model(junk)
