"""The detector's model: a Gaussian Mixture on standardized window features.

``GMMDetector`` is a scikit-learn outlier detector. ``score_samples`` is the per-window
log-likelihood (higher = more normal); ``decision_function`` is the score minus the
label-free threshold ``offset_`` (negative = anomalous); ``predict`` gives +1 (inlier) or
-1 (outlier). Missing values (NaN) are imputed with the training median, because a
feature that is absent in one window (no calls of a function, a gauge not reported) should
not look like an extreme value. Scoring is per row; only ``fit`` reads the row order (its
held-out folds are contiguous runs of windows, see ``shuffle_folds``).
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.base import BaseEstimator, OutlierMixin
from sklearn.mixture import GaussianMixture
from sklearn.utils.validation import check_is_fitted, check_random_state, validate_data

from eacgm_detector.drift import DriftThreshold
from eacgm_detector.threshold import pot_threshold, quantile_threshold

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
THRESHOLD_METHODS = ("pot", "quantile")

#: How many times the threshold's distance below the median held-out score a window must lie
#: to be an anomaly alone (``single_threshold_``). Not a tail risk extrapolated further: the
#: tail fitted on the training runs' held-out windows is lighter than other runs' (a POT
#: threshold at risk 1e-6 still let 4 of the 6 isolated false alarms of the clean H200 runs of
#: 2026-12-04 through). Those lay up to about 2.2 times that distance below the median (one slow
#: call among two a window caught, a metric export a tick late), the first anomalous windows of
#: the injected faults 12 to 290,000 times (docs/benchmarks.md).
SINGLE_WINDOW_MARGIN = 3.0
#: Default cap on the windows one mixture is fitted on (``max_fit_windows``); see
#: docs/detector.md "Fit time" for the measured cost and the error of the sample.
MAX_FIT_WINDOWS = 4000
#: Names of the confirmation rules (:meth:`GMMDetector.rule`), as events and ``score`` give them.
RULE_THRESHOLD = "threshold"
RULE_CONSECUTIVE = "consecutive"
RULE_FAR = "far"
#: Features whose unit (standard deviation or resolution) is below this are constant at 0 in
#: training: they are centred, not standardized, and ``reg_covar`` bounds their variance.
_CONSTANT_STD = 1e-12
#: The smallest change, as a share of a feature's training level, that standardization
#: resolves: a feature's unit is never less than this share of its level (of 1 + this, as a
#: log, for a logarithm). A gauge that sat still through training (GPU memory, to the byte)
#: would otherwise turn a change small against its level (a 2 MiB allocation in 6.5 GB) into
#: millions of standard deviations and take every attribution. 1 %: a change of a level by
#: less is no fault a person would act on, and it is the size by which healthy runs of one
#: job differ from each other (the median shift of a feature's level between the clean H200
#: runs of 2026-12-04 was 0.6 %), while the steadiest latencies vary by about that much
#: within a run (synchronize p95: 0.9 %), so a coarser resolution would blunt them.
RELATIVE_RESOLUTION = 1e-2
#: Largest magnitude of a feature value that ``fit`` and ``score`` take from a file. The
#: training statistics square deviations and sum them over the windows: beyond about
#: 1e154 / sqrt(n_windows) a standard deviation overflows float64, and the model would hold
#: infinities that its own file format refuses. 1e100 leaves room for any number of windows
#: and is far beyond any real feature (an exabyte is 1e18 bytes, a log duration is below 100).
MAX_ABS_VALUE = 1e100


class GMMDetector(OutlierMixin, BaseEstimator):
    """Gaussian Mixture anomaly detector with BIC-chosen size and a label-free threshold.

    Parameters
    ----------
    max_components : int, default=8
        Cap on the number of mixture components; BIC chooses within ``1..max_components``.
    covariance_type : {"full", "tied", "diag", "spherical"}, default="full"
    reg_covar : float, default=1e-2
        Added to covariance diagonals in standardized units, so constant or nearly constant
        features get a finite variance instead of a singular matrix, and no component can
        shrink onto a near-degenerate slice of the training windows (a counter that took a
        handful of values), where any new value would look infinitely unlikely. A fit on
        ``n`` windows of ``d`` features adds at least ``d / n``: a sample covariance's
        smallest eigenvalues come out too small by about that much (Marchenko-Pastur), and
        new windows would look unlikely along exactly those directions; it matters for a
        warm-up of a few hundred windows, not for thousands.
    spike_floor : float, default=0.0
        Least variance of every component on a spiky feature, as a multiple of that feature's
        training variance: a feature that varies in training but lies within its resolution
        of one value in at least half of the windows (a count that is 0 but for rare bursts).
        With ``reg_covar`` alone the component of its usual value is about a tenth of its
        spread wide, and a small value there where training had none costs tens of
        log-likelihood units in normal windows of a later period. Implemented as a larger
        unit for those features (``scale_``); other features are untouched. 0 (the default): off;
        docs/detector.md says why it is not on.
    threshold_method : {"pot", "quantile"}, default="pot"
        Extreme-value (Peaks-Over-Threshold) fit or empirical quantile of held-out scores.
    threshold_risk : float, default=1e-3
        Target fraction of normal windows flagged.
    trim_fraction : float, default=0.005
        Share of the lowest held-out scores left out of the threshold fit: training data
        is mostly, not entirely, normal, and one wild window must not push the threshold
        so far down that nothing is ever flagged. Not more: with contiguous folds the low
        held-out scores are mostly drift that future windows will show too, and the
        threshold must cover it.
    max_fit_windows : int or None, default=MAX_FIT_WINDOWS
        Most windows any one mixture is fitted on: more are sampled at random (seeded, kept in
        time order). EM costs iterations x windows x components x features squared, and the
        search fits up to ``max_components`` mixtures plus one per fold and a final one, so
        without a cap a fit on 30k windows of 114 features took minutes. The sample bounds
        every EM run; every window is still scored out of fold (linear in rows) for the
        threshold. None fits on every window.
    n_folds : int, default=5
        Folds for out-of-fold (held-out) scores that set the threshold and check BIC's choice.
    shuffle_folds : bool, default=False
        False: the folds are contiguous runs of rows, which ``fit`` takes to be windows in
        time order. Neighbouring windows are near-copies of each other, so a random fold
        would be scored by a model that saw its neighbours: held-out scores too good, and a
        threshold too loose for the drift that real future windows show. True: random folds.
    derived_from : sequence of int or None, default=None
        Per feature, -1 or the index of the feature it is a deviation of (a context feature,
        :mod:`eacgm_detector.context`); a context feature's resolution is its base feature's.
        A missing deviation (a series' first windows) is completed with its most likely value
        given the window's other features (:meth:`_complete`): imputing it as the level's
        distance from the training mean claimed a jump at the start of every series that
        began elsewhere. None: no context features.
    logarithmic : sequence of bool or None, default=None
        Per feature, whether it is a logarithm (a log duration): its differences are ratios,
        so its resolution is ``log1p(RELATIVE_RESOLUTION)`` in its own units, not a share of
        a level that depends on the unit it was taken in. None: no logarithms.
    n_init : int, default=1
    max_iter : int, default=200
    random_state : int, RandomState or None, default=None

    Attributes
    ----------
    n_components_ : int
    bic_ : ndarray of shape (n_tried,)
        BIC for ``1..n_tried`` components on the first fold's training part (one entry, for
        the given size, when ``fit`` was given ``n_components``).
    holdout_log_likelihood_ : ndarray of shape (n_tried,)
        Mean log-likelihood of the first fold's held-out windows, per tried size.
    threshold_ : float
        Log-likelihood threshold; ``offset_`` is the same value (sklearn's name).
    threshold_method_ : str
        The rule that produced it ("pot" or "quantile" when POT had too few excesses).
    single_threshold_ : float
        A score below which one window alone is beyond doubt, where the online detector
        otherwise waits for ``confirm_windows`` consecutive windows below ``threshold_``:
        ``SINGLE_WINDOW_MARGIN`` times as far below the median held-out score as the threshold.
    center_, scale_, fill_ : ndarray of shape (n_features,)
        Standardization and median imputation learned from training windows.
    holdout_scores_ : ndarray of shape (n_samples,)
        Each training window's out-of-fold score (not saved in model files).
    holdout_median_ : float or None
        Their median, which :class:`~eacgm_detector.drift.DriftThreshold` compares recent
        scores with (None for a model file that predates it: no drift following).
    mixture_ : GaussianMixture
    n_iter_ : int
        EM iterations of the final fit.
    """

    def __init__(
        self,
        max_components: int = 8,
        *,
        covariance_type: str = "full",
        reg_covar: float = 1e-2,
        spike_floor: float = 0.0,
        threshold_method: str = "pot",
        threshold_risk: float = 1e-3,
        trim_fraction: float = 0.005,
        max_fit_windows: int | None = MAX_FIT_WINDOWS,
        n_folds: int = 5,
        shuffle_folds: bool = False,
        derived_from=None,
        logarithmic=None,
        n_init: int = 1,
        max_iter: int = 200,
        random_state=None,
    ) -> None:
        self.max_components = max_components
        self.covariance_type = covariance_type
        self.reg_covar = reg_covar
        self.spike_floor = spike_floor
        self.threshold_method = threshold_method
        self.threshold_risk = threshold_risk
        self.trim_fraction = trim_fraction
        self.max_fit_windows = max_fit_windows
        self.n_folds = n_folds
        self.shuffle_folds = shuffle_folds
        self.derived_from = derived_from
        self.logarithmic = logarithmic
        self.n_init = n_init
        self.max_iter = max_iter
        self.random_state = random_state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags

    def _check_params(self) -> None:
        if not isinstance(self.max_components, (int, np.integer)) or self.max_components < 1:
            raise ValueError(f"max_components={self.max_components!r}: expected an integer >= 1")
        if self.covariance_type not in COVARIANCE_TYPES:
            raise ValueError(
                f"covariance_type={self.covariance_type!r}: expected one of {COVARIANCE_TYPES}"
            )
        if not self.reg_covar > 0:
            raise ValueError(f"reg_covar={self.reg_covar!r}: expected a float > 0")
        number = isinstance(self.spike_floor, (int, float, np.integer, np.floating))
        if not (number and 0 <= self.spike_floor < np.inf):
            raise ValueError(f"spike_floor={self.spike_floor!r}: expected a float >= 0")
        if self.threshold_method not in THRESHOLD_METHODS:
            raise ValueError(
                f"threshold_method={self.threshold_method!r}: expected one of {THRESHOLD_METHODS}"
            )
        if not 0 < self.threshold_risk < 1:
            raise ValueError(f"threshold_risk={self.threshold_risk!r}: expected 0 < risk < 1")
        if not 0 <= self.trim_fraction < 0.5:
            raise ValueError(f"trim_fraction={self.trim_fraction!r}: expected 0 <= fraction < 0.5")
        if self.max_fit_windows is not None and (
                not isinstance(self.max_fit_windows, (int, np.integer)) or self.max_fit_windows < 2):
            raise ValueError(f"max_fit_windows={self.max_fit_windows!r}: expected None or an integer >= 2")
        if not isinstance(self.n_folds, (int, np.integer)) or self.n_folds < 2:
            raise ValueError(f"n_folds={self.n_folds!r}: expected an integer >= 2")

    def _derived(self, n_features: int) -> np.ndarray:
        """``derived_from`` checked against ``n_features``, as an int array (-1: plain)."""
        if self.derived_from is None:
            return np.full(n_features, -1)
        src = np.asarray(self.derived_from)
        plain = src == -1 if src.ndim == 1 else None
        if (src.shape != (n_features,) or src.dtype.kind not in "iu"
                or not np.all(plain | ((src >= 0) & (src < n_features)))
                or not np.all(plain[src[~plain]])):
            raise ValueError(
                f"derived_from={self.derived_from!r}: expected {n_features} entries, each -1 or "
                f"the index of a feature that is itself -1"
            )
        return src.astype(int)

    def _logarithmic(self, n_features: int) -> np.ndarray:
        """``logarithmic`` checked against ``n_features``, as a bool array."""
        if self.logarithmic is None:
            return np.zeros(n_features, dtype=bool)
        logs = np.asarray(self.logarithmic)
        if logs.shape != (n_features,) or logs.dtype.kind != "b":
            raise ValueError(f"logarithmic={self.logarithmic!r}: expected {n_features} booleans")
        return logs

    def _impute(self, X: np.ndarray) -> np.ndarray:
        """NaN to the training median (a fit's first step; scoring then completes a missing
        deviation, see :meth:`_complete`)."""
        return np.where(np.isnan(X), self.fill_, X)

    def _complete(self, Z: np.ndarray, missing: np.ndarray, gm: GaussianMixture | None = None) -> np.ndarray:
        """Standardized windows ``Z`` with their ``missing`` entries (deviations a series'
        first windows cannot have, see ``derived_from``) set to their most likely values
        given the rest of the window: the conditional mean under each component, keeping the
        completion the mixture scores highest. Any fixed value (the training median, or the
        level's distance from the training mean as before) claims a change, or none, that
        the window's own features contradict wherever its level is not the training one.
        ``gm``: the mixture to complete with (default ``mixture_``)."""
        gm = self.mixture_ if gm is None else gm
        Z = Z.copy()
        patterns, which = np.unique(missing, axis=0, return_inverse=True)
        for p, mask in enumerate(patterns):
            if not mask.any():
                continue
            rows = np.flatnonzero(which.ravel() == p)
            z, best = Z[rows], np.full(rows.size, -np.inf)
            out = z.copy()
            for c in range(gm.n_components):
                P = _precision(gm, c)
                # E[z_m | z_o] = mu_m - P_mm^-1 P_mo (z_o - mu_o), P the component's precision.
                mu = gm.means_[c]
                cand = z.copy()
                cand[:, mask] = mu[mask] - np.linalg.solve(
                    P[np.ix_(mask, mask)], P[np.ix_(mask, ~mask)] @ (z[:, ~mask] - mu[~mask]).T).T
                score = gm.score_samples(cand)
                better = score > best
                out[better], best[better] = cand[better], score[better]
            Z[rows] = out
        return Z

    def _mixture(self, k: int, seed: int, Z: np.ndarray,
                 start: GaussianMixture | None = None) -> GaussianMixture:
        """An unfitted mixture of ``k`` components for the windows ``Z``; with ``start`` (a
        fitted mixture of ``k`` components), EM starts from its parameters."""
        init = {} if start is None else dict(weights_init=start.weights_, means_init=start.means_,
                                             precisions_init=start.precisions_)
        return GaussianMixture(
            n_components=k,
            covariance_type=self.covariance_type,
            reg_covar=max(self.reg_covar, Z.shape[1] / Z.shape[0]),
            n_init=1 if start is not None else self.n_init,
            max_iter=self.max_iter,
            random_state=seed,
            **init,
        )

    def _sample(self, rows: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
        """At most ``max_fit_windows`` of ``rows``, drawn at random and kept in time order."""
        cap = self.max_fit_windows
        if cap is None or rows.size <= cap:
            return rows
        return np.sort(rng.choice(rows, cap, replace=False))

    def fit(self, X, y=None, n_components: int | None = None):
        """Fit on windows assumed mostly normal.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Window features in time order (the folds are contiguous unless
            ``shuffle_folds``); NaN marks a missing value.
        y : ignored
        n_components : int or None
            Skip the component search and fit this many (at most ``max_components``): a
            refresh of a model whose size an earlier search chose, at the cost of one
            mixture per fold and a final one instead of up to ``max_components`` more.
        """
        self._check_params()
        X = validate_data(self, X, dtype=np.float64, ensure_all_finite="allow-nan",
                          ensure_min_samples=2)
        rng = check_random_state(self.random_state)
        seed = int(rng.randint(np.iinfo(np.int32).max))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
            fill = np.nanmedian(X, axis=0)
        self.fill_ = np.where(np.isfinite(fill), fill, 0.0)
        X_raw = X
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked just below
            X = self._impute(X)
            self.center_ = X.mean(axis=0)
            self.scale_ = self._scales(X)
        bad = ~(np.isfinite(self.center_) & np.isfinite(self.scale_))
        if bad.any():
            j = int(np.argmax(bad))
            raise ValueError(
                f"feature {j}: values up to {np.nanmax(np.abs(X[:, j])):.3g} in magnitude overflow "
                f"float64 statistics (mean {self.center_[j]:.3g}, scale {self.scale_[j]:.3g}); "
                f"expected values within +-{MAX_ABS_VALUE:g}"
            )
        Z = (X - self.center_) / self.scale_

        n = Z.shape[0]
        order = rng.permutation(n) if self.shuffle_folds else np.arange(n)
        folds = np.array_split(order, min(self.n_folds, n))
        hold0 = folds[0]
        train0 = self._sample(np.setdiff1d(np.arange(n), hold0), rng)
        bic, hold_ll, fitted = [], [], []
        sizes = range(1, min(self.max_components, train0.size) + 1)
        if n_components is not None:
            sizes = [min(int(n_components), sizes[-1])]
        for k in sizes:
            gm = self._mixture(k, seed, Z[train0]).fit(Z[train0])
            bic.append(gm.bic(Z[train0]))
            hold_ll.append(gm.score(Z[self._sample(hold0, rng)]))
            fitted.append(gm)
            # BIC rising twice in a row: larger mixtures will not win, stop paying for them.
            if len(bic) >= 3 and bic[-1] > bic[-2] > bic[-3]:
                break
        self.bic_ = np.asarray(bic)
        self.holdout_log_likelihood_ = np.asarray(hold_ll)
        best = int(np.argmin(self.bic_))
        # BIC's pick must generalise: if a smaller mixture scores held-out windows clearly
        # better, it overfitted, and the held-out winner is taken instead.
        if self.holdout_log_likelihood_[best] < self.holdout_log_likelihood_.max() - 1.0:
            best = int(np.argmax(self.holdout_log_likelihood_))
        self.n_components_ = list(sizes)[best]
        # The deviations a table's first windows lack were the median ("no change") so far;
        # from here on they are completed as scoring completes them, by the search's pick.
        missing = np.isnan(X_raw) & (self._derived(X_raw.shape[1]) >= 0)
        if missing.any():
            rows = np.flatnonzero(missing.any(axis=1))
            Z[rows] = self._complete(Z[rows], missing[rows], fitted[best])

        # Every window is scored by a model that did not see it (scoring is linear in rows);
        # each of those models, like the search's, is fitted on a sample of its training part.
        oof = np.empty(n)
        oof[hold0] = fitted[best].score_samples(Z[hold0])
        for hold in folds[1:]:
            train = self._sample(np.setdiff1d(np.arange(n), hold), rng)
            k = min(self.n_components_, train.size)
            oof[hold] = self._mixture(k, seed, Z[train]).fit(Z[train]).score_samples(Z[hold])
        # The final mixture starts from the search's pick, fitted on most of the same windows,
        # so EM needs a few iterations instead of a fresh k-means start and a full climb.
        every = self._sample(np.arange(n), rng)
        self.mixture_ = self._mixture(self.n_components_, seed, Z[every], start=fitted[best]).fit(Z[every])
        self.n_iter_ = self.mixture_.n_iter_
        self.holdout_scores_ = oof
        median = self.holdout_median_ = float(np.median(oof))
        oof = np.sort(oof)[int(np.ceil(self.trim_fraction * n)):]
        if self.threshold_method == "pot":
            self.threshold_, self.threshold_method_ = pot_threshold(oof, self.threshold_risk)
        else:
            self.threshold_ = quantile_threshold(oof, self.threshold_risk)
            self.threshold_method_ = "quantile"
        self.offset_ = self.threshold_
        self.single_threshold_ = median - SINGLE_WINDOW_MARGIN * max(median - self.threshold_, 0.0)
        return self

    def _scales(self, X: np.ndarray) -> np.ndarray:
        """Per feature, its unit for standardization: the training standard deviation, but
        never less than ``RELATIVE_RESOLUTION`` of the feature's level (a context feature's
        level is its base feature's), so that a gauge that happened to sit still in training
        does not turn a change small against its level into millions of standard deviations.
        A feature constant at 0 (a function never called, an error counter that stayed 0)
        has no level to be relative to: any change of it is news, and its variance floor is
        ``reg_covar`` in its own units, as unlikely as ``reg_covar`` says; when a short fit
        raises the floor in standardized units to d / n (see ``reg_covar``), its unit is
        shrunk to match. A spiky feature's unit is enlarged so that the floor, in its own
        units, is ``spike_floor`` times its training variance (see ``spike_floor``)."""
        src = self._derived(X.shape[1])
        level = np.abs(np.where(src >= 0, self.center_[src], self.center_))
        resolution = np.where(self._logarithmic(X.shape[1]), np.log1p(RELATIVE_RESOLUTION),
                              RELATIVE_RESOLUTION * level)
        std = X.std(axis=0)
        scale = np.maximum(std, resolution)
        floor = max(self.reg_covar, X.shape[1] / X.shape[0])
        if self.spike_floor > 0:
            # A spiky feature: it has spread, but at least half the windows sit within its
            # resolution of one value (its median absolute deviation is below the resolution).
            mad = np.median(np.abs(X - np.median(X, axis=0)), axis=0)
            spiky = (std > resolution) & (std > _CONSTANT_STD) & (mad <= resolution)
            n_fit = X.shape[0] if self.max_fit_windows is None else min(X.shape[0], self.max_fit_windows)
            least = max(self.reg_covar, X.shape[1] / n_fit)
            scale = np.where(spiky, np.maximum(scale, std * np.sqrt(self.spike_floor / least)), scale)
        return np.where(scale > _CONSTANT_STD, scale, np.sqrt(self.reg_covar / floor))

    def _standardize(self, X) -> np.ndarray:
        check_is_fitted(self, "mixture_")
        X = validate_data(self, X, dtype=np.float64, ensure_all_finite="allow-nan", reset=False)
        Z = (self._impute(X) - self.center_) / self.scale_
        missing = np.isnan(X) & (self._derived(X.shape[1]) >= 0)
        if missing.any():
            rows = np.flatnonzero(missing.any(axis=1))
            Z[rows] = self._complete(Z[rows], missing[rows])
        return Z

    def score_samples(self, X) -> np.ndarray:
        """Log-likelihood of each window in standardized feature space, shape (n_samples,)."""
        Z = self._standardize(X)
        return self.mixture_.score_samples(Z)

    def decision_function(self, X) -> np.ndarray:
        """``score_samples(X) - offset_``: negative for anomalies, shape (n_samples,)."""
        return self.score_samples(X) - self.offset_

    def predict(self, X) -> np.ndarray:
        """+1 for normal windows, -1 for anomalies, shape (n_samples,)."""
        return np.where(self.decision_function(X) >= 0, 1, -1)

    def rule(self, score: float, run: int, confirm_windows: int) -> str | None:
        """The confirmation rule that makes a window with this score an anomaly, or None;
        ``run`` is the number of consecutive windows below ``threshold_`` that end with it
        (0 if it is not below). ``RULE_THRESHOLD``: below the threshold, where one window
        suffices (``confirm_windows`` 1); ``RULE_CONSECUTIVE``: the ``confirm_windows``-th
        (or a later) window in a row below it; ``RULE_FAR``: alone, but far below it
        (``single_threshold_``), where a fault leaves no doubt in its first window."""
        return self.rule_at(score, run, confirm_windows, self.threshold_, self.single_threshold_)

    def is_anomaly(self, score: float, run: int, confirm_windows: int) -> bool:
        """Whether a window with this score is reported (:meth:`rule` is not None)."""
        return self.rule(score, run, confirm_windows) is not None

    def rule_at(self, score: float, run: int, confirm_windows: int, threshold: float,
                single_threshold: float) -> str | None:
        """:meth:`rule` against given thresholds (those a :class:`DriftThreshold` moved)."""
        if not score < threshold:
            return None
        if run >= confirm_windows:
            return RULE_THRESHOLD if confirm_windows <= 1 else RULE_CONSECUTIVE
        return RULE_FAR if score < single_threshold else None

    def drift(self, windows: int) -> DriftThreshold:
        """A fresh :class:`DriftThreshold` for this model's thresholds (``windows`` 0: fixed)."""
        return DriftThreshold(self.threshold_, self.single_threshold_,
                              getattr(self, "holdout_median_", None), windows)

    def rules(self, scores: np.ndarray, confirm_windows: int,
              drift_windows: int = 0) -> tuple[list[str | None], np.ndarray]:
        """:meth:`rule` over the scores of consecutive windows in time order, as the online
        detector reports them, with the threshold following drift over ``drift_windows``
        (:class:`DriftThreshold`; 0 keeps it fixed). Returns the rule that fired per window
        (None where none did) and the threshold each window was compared with."""
        out: list[str | None] = []
        thresholds = np.empty(len(scores))
        drift = self.drift(drift_windows)
        run = 0
        for i, score in enumerate(scores):
            thr, single = drift.current()
            run = run + 1 if score < thr else 0
            out.append(self.rule_at(float(score), run, confirm_windows, thr, single))
            thresholds[i] = thr
            drift.observe(float(score), score < thr)
        return out, thresholds

    def anomalies(self, scores: np.ndarray, confirm_windows: int, drift_windows: int = 0) -> np.ndarray:
        """Whether each of consecutive windows is reported (:meth:`rules`), a bool per window."""
        rules, _ = self.rules(scores, confirm_windows, drift_windows)
        return np.array([r is not None for r in rules], dtype=bool)

    def contributions(self, X) -> np.ndarray:
        """Per-feature share of each window's unlikeliness, shape (n_samples, n_features).

        Feature ``j`` gets its squared z-score ``(z_j - mu_j)^2 / Sigma_jj`` under the
        component that best explains the window. Marginal rather than conditional on the
        other features, because real faults move groups of correlated features together
        (a slow all-reduce shifts its duration, tail and bandwidth at once), and a person
        should see that whole group named, not only the feature that broke a correlation.
        """
        Z = self._standardize(X)
        gm = self.mixture_
        comp = gm.predict(Z)
        var = np.stack([_variances(gm, c) for c in range(gm.n_components)])
        return (Z - gm.means_[comp]) ** 2 / var[comp]


def _precision(gm: GaussianMixture, c: int) -> np.ndarray:
    """Component ``c``'s precision matrix (d x d) for any covariance type."""
    prec = gm.precisions_
    d = gm.means_.shape[1]
    if gm.covariance_type == "full":
        return prec[c]
    if gm.covariance_type == "tied":
        return prec
    if gm.covariance_type == "diag":
        return np.diag(prec[c])
    return np.eye(d) * prec[c]


def _variances(gm: GaussianMixture, c: int) -> np.ndarray:
    """Diagonal of component ``c``'s covariance for any covariance type."""
    cov = gm.covariances_
    d = gm.means_.shape[1]
    if gm.covariance_type == "full":
        return np.diag(cov[c])
    if gm.covariance_type == "tied":
        return np.diag(cov)
    if gm.covariance_type == "diag":
        return cov[c]
    return np.full(d, cov[c])
