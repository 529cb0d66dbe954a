"""Baseline anomaly scorers for the detector benchmark, scored like the detector.

Every scorer maps (train, test) to anomaly scores (higher = more anomalous) for the test
rows and their flags, chosen without labels. The detector runs as ``otel-eacgm detector
fit``/``score`` run it on a feature table (context features, out-of-fold threshold at the
alarm budget per entity-hour, following drift, flags as ``serve`` raises them); the baselines are fitted on a random 80% of train and every test row above the
same Peaks-Over-Threshold rule's threshold on the other 20% is flagged.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from sklearn.decomposition import PCA
from sklearn.ensemble import IsolationForest
from sklearn.preprocessing import StandardScaler

from eacgm_detector.config import DetectorConfig
from eacgm_detector.online import fit_table, table_features
from eacgm_detector.threshold import pot_threshold

RISK = 1e-3


def _split(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    idx = np.random.default_rng(seed).permutation(n)
    cut = int(0.8 * n)
    return idx[:cut], idx[cut:]


def _flagged(scores: np.ndarray, held_out_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The scores and their flags: above the POT threshold of the held-out scores (the rule
    works on log-likelihood-like 'higher is normal', hence the negations)."""
    t, _ = pot_threshold(-held_out_scores, RISK)
    return scores, scores > -t


def gmm(train, test, window_s: float, **config):
    """The detector with its default configuration (``config`` overrides keys) and its own
    out-of-fold threshold; rows are windows in time order, ``window_s`` apart, as the data
    sets give them (the alarm budget per hour needs the window length)."""
    cfg = DetectorConfig(**({"random_state": 0, "window_s": window_s} | config)).validate()
    names = [f"x{j}" for j in range(train.shape[1])]
    model = fit_table(cfg, names, train)
    X, _ = table_features(model, names, test)
    scores = model.detector.score_samples(X)
    return -scores, model.detector.anomalies(scores, cfg.confirm_windows, cfg.drift_windows)


def random_scores(train, test):
    rng = np.random.default_rng(0)
    return _flagged(rng.random(len(test)), rng.random(len(train) - int(0.8 * len(train))))


def pca_error(train, test, variance: float = 0.95):
    fit_idx, hold_idx = _split(len(train))
    scaler = StandardScaler().fit(train[fit_idx])
    pca = PCA(n_components=variance, svd_solver="full").fit(scaler.transform(train[fit_idx]))

    def err(X):
        Z = scaler.transform(X)
        return ((Z - pca.inverse_transform(pca.transform(Z))) ** 2).sum(axis=1)
    return _flagged(err(test), err(train[hold_idx]))


def isolation_forest(train, test):
    fit_idx, hold_idx = _split(len(train))
    forest = IsolationForest(n_estimators=100, random_state=0).fit(train[fit_idx])
    return _flagged(-forest.score_samples(test), -forest.score_samples(train[hold_idx]))


#: "fixed threshold" is the same fit (same seed) with the operating point before the threshold
#: followed drift (``drift_windows`` 0, the rule of 2026-12-07): the two rows differ by that
#: alone. Scorers named "detector..." take ``window_s``.
SCORERS = {"detector (GMM)": gmm,
           "detector, fixed threshold": partial(gmm, drift_windows=0),
           "random": random_scores, "PCA recon. error": pca_error, "IsolationForest": isolation_forest}
