"""Label-free anomaly thresholds on log-likelihood scores.

Scores are log-likelihoods, so anomalies sit in the *lower* tail. Both rules work on the
negated scores (higher = more anomalous) and return a log-likelihood threshold: a window is
anomalous when its score is below it.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

#: Fewest tail excesses a Generalized Pareto fit is trusted with; below that POT falls back
#: to the empirical quantile, which cannot extrapolate but cannot blow up either.
MIN_POT_EXCESSES = 10


def quantile_threshold(scores: np.ndarray, risk: float) -> float:
    """Return the ``risk`` lower quantile of held-out ``scores``.

    Parameters
    ----------
    scores : ndarray of shape (n_samples,)
        Log-likelihoods of windows that were not used to fit the model.
    risk : float in (0, 1)
        Fraction of normal windows allowed below the threshold.
    """
    return float(np.quantile(np.asarray(scores, dtype=float), risk))


def pot_threshold(scores: np.ndarray, risk: float, level: float = 0.95) -> tuple[float, str]:
    """Return a Peaks-Over-Threshold (extreme value) threshold and the rule actually used.

    The negated scores above their ``level`` quantile are fitted with a Generalized Pareto
    distribution (Siffer et al., KDD 2017), which extrapolates to risks smaller than
    ``1 / n_samples``: what a few hundred warm-up windows need to keep false alarms rare.

    Returns
    -------
    threshold : float
        Log-likelihood threshold.
    method : {"pot", "quantile"}
        ``"quantile"`` when there were too few excesses or the fit was degenerate.
    """
    neg = -np.asarray(scores, dtype=float)
    n = neg.size
    if n * (1.0 - level) < MIN_POT_EXCESSES:
        level = 1.0 - MIN_POT_EXCESSES / n if n > 2 * MIN_POT_EXCESSES else level
    t0 = float(np.quantile(neg, level))
    excesses = neg[neg > t0] - t0
    if excesses.size < MIN_POT_EXCESSES or risk * n >= excesses.size:
        return quantile_threshold(scores, risk), "quantile"
    if np.ptp(excesses) <= 0:
        return -t0, "quantile"
    gamma, _, sigma = stats.genpareto.fit(excesses, floc=0.0)
    if gamma < 0:
        # A Gaussian mixture's negative log-likelihood has a chi-square-like, exponential
        # tail (Gumbel domain); a fitted bounded tail (gamma < 0) is small-sample noise that
        # would put the threshold at the largest value seen, so fall back to gamma = 0.
        gamma, sigma = 0.0, float(excesses.mean())
    ratio = risk * n / excesses.size
    if abs(gamma) < 1e-8:
        z = t0 - sigma * np.log(ratio)
    else:
        z = t0 + sigma / gamma * (ratio ** (-gamma) - 1.0)
    if not np.isfinite(z):
        return quantile_threshold(scores, risk), "quantile"
    # A heavy-tailed fit can extrapolate to absurd distances; never beyond 10x the observed
    # excess range, so one wild warm-up window cannot switch detection off.
    z = min(float(z), t0 + 10.0 * float(excesses.max()))
    return -z, "pot"
