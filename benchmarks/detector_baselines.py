"""Baseline anomaly scorers for the detector benchmark, scored like the detector.

Every scorer maps (train, test) to anomaly scores (higher = more anomalous) for the test
rows and a label-free threshold: fitted on a random 80% of train, thresholded by the same
Peaks-Over-Threshold rule on the other 20%, so the detector and the baselines differ only in
their model.
"""

from __future__ import annotations

import numpy as np
from sklearn.decomposition import PCA
from sklearn.ensemble import IsolationForest
from sklearn.preprocessing import StandardScaler

from eacgm_detector.model import GMMDetector
from eacgm_detector.threshold import pot_threshold

RISK = 1e-3


def _split(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    idx = np.random.default_rng(seed).permutation(n)
    cut = int(0.8 * n)
    return idx[:cut], idx[cut:]


def _threshold(held_out_scores: np.ndarray) -> float:
    """POT threshold on anomaly scores (the rule works on log-likelihood-like 'higher is normal')."""
    t, _ = pot_threshold(-held_out_scores, RISK)
    return -t


def gmm(train, test, **params):
    """The detector's model with its own out-of-fold threshold."""
    det = GMMDetector(random_state=0, threshold_risk=RISK, **params).fit(train)
    return -det.score_samples(test), -det.threshold_


def random_scores(train, test):
    rng = np.random.default_rng(0)
    return rng.random(len(test)), _threshold(rng.random(len(train) - int(0.8 * len(train))))


def pca_error(train, test, variance: float = 0.95):
    fit_idx, hold_idx = _split(len(train))
    scaler = StandardScaler().fit(train[fit_idx])
    pca = PCA(n_components=variance, svd_solver="full").fit(scaler.transform(train[fit_idx]))

    def err(X):
        Z = scaler.transform(X)
        return ((Z - pca.inverse_transform(pca.transform(Z))) ** 2).sum(axis=1)
    return err(test), _threshold(err(train[hold_idx]))


def isolation_forest(train, test):
    fit_idx, hold_idx = _split(len(train))
    forest = IsolationForest(n_estimators=100, random_state=0).fit(train[fit_idx])
    return -forest.score_samples(test), _threshold(-forest.score_samples(train[hold_idx]))


SCORERS = {"detector (GMM)": gmm, "random": random_scores, "PCA recon. error": pca_error,
           "IsolationForest": isolation_forest}
