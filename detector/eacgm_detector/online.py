"""One entity's learning loop: warm up, fit, score, refit on windows not flagged.

Each entity has its own vocabulary, windows and model, because normal behaviour is a
property of a process or a rank (a data loader and a trainer have nothing in common), and
because it keeps every entity's result independent of how entities are spread over replicas.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from eacgm_detector.config import DetectorConfig
from eacgm_detector.context import ContextTracker, add_context, base_name, derived_from
from eacgm_detector.features import (Vocabulary, feature_category, feature_names, is_logarithmic,
                                     vectorize, window_features)
from eacgm_detector.model import GMMDetector
from eacgm_detector.persist import SavedModel
from eacgm_detector.records import Entity, entity_label
from eacgm_detector.windows import EntityWindows, Window

log = logging.getLogger(__name__)


#: Fits of an entity between two component searches; the refits between them keep the size
#: and refit means, covariances and threshold on the newest history (the slow drift the
#: history follows moves those, rarely the number of modes).
SEARCH_EVERY = 10


@dataclass
class Contribution:
    """One feature's part in an anomaly."""

    name: str
    category: str
    contribution: float
    value: float
    #: Its share of the window's summed contributions (0..1): how much of the drop it explains.
    share: float = math.nan


@dataclass
class WindowResult:
    """The outcome for one closed window; ``score`` is None during warm-up."""

    entity: Entity
    start_ns: int
    end_ns: int
    score: float | None
    threshold: float | None
    anomalous: bool
    #: Consecutive windows of the entity below the threshold, this one included (0: not below).
    below: int = 0
    #: The confirmation rule that made it an anomaly (``GMMDetector.rule``), None if it is not.
    rule: str | None = None
    top: list[Contribution] = field(default_factory=list)
    affected: list[tuple[bytes, bytes]] = field(default_factory=list)
    span_refs: list[tuple] = field(default_factory=list, repr=False)


def model_from_config(cfg: DetectorConfig, names: list[str] | None = None) -> GMMDetector:
    """A fresh estimator with the config's hyperparameters; with the feature ``names``, it
    knows which are context features of which (``derived_from``) and which are logarithms
    (``logarithmic``)."""
    return GMMDetector(cfg.max_components, covariance_type=cfg.covariance_type,
                       reg_covar=cfg.reg_covar, spike_floor=cfg.spike_floor,
                       max_fit_windows=cfg.max_fit_windows,
                       threshold_method=cfg.threshold_method,
                       threshold_risk=cfg.risk, random_state=cfg.random_state,
                       derived_from=None if names is None else derived_from(names, cfg.context_windows),
                       logarithmic=None if names is None else [is_logarithmic(n) for n in names])


def learnable(names: list[str], X: np.ndarray, source: str | None = None,
              context_windows=()) -> tuple[list[str], np.ndarray]:
    """The features (columns of ``X``) that have a value in at least one window, with a
    warning naming the others; ``ValueError`` when none has. A context feature (a
    deviation over one of ``context_windows``) needs a value in at least half the windows,
    silently: a history shorter than twice its span (the service's first fits) has too few
    to learn its spread from, and the model would fill the windows that lack it from that
    too-narrow spread and then find every later window's deviation unlikely. It joins the
    model at a later refit.

    A feature missing from every training window (a column left empty, a deviation over more
    windows than the table has) teaches the model nothing: it would be imputed as one constant,
    and every later window that has a value would lie infinitely far from it. Such features are
    left out of the model, so scoring ignores them too. A constant feature is kept: a change of
    it is news the model can weigh (``GMMDetector`` bounds its unit, see ``_scales``).
    ``source`` (a file name) starts the messages.
    """
    where = f"{source}: " if source else ""
    sparse = np.array([base_name(n, context_windows) != n for n in names], dtype=bool)
    sparse &= np.isnan(X).mean(axis=0) > 0.5
    names, X = [n for n, s in zip(names, sparse) if not s], X[:, ~sparse]
    empty = np.isnan(X).all(axis=0)
    if empty.all():
        raise ValueError(f"{where}no feature has a value in any of the {len(X)} windows (all missing "
                         f"or NaN): nothing to learn from")
    if empty.any():
        dropped = [n for n, e in zip(names, empty) if e]
        more = f" and {len(dropped) - 10} more" if len(dropped) > 10 else ""
        log.warning("%s%d features have no value in any window and are left out of the model (nothing "
                    "to learn from; scoring ignores them): %s%s",
                    where, len(dropped), ", ".join(dropped[:10]), more)
    return [n for n, e in zip(names, empty) if not e], X[:, ~empty]


def fit_rows(cfg: DetectorConfig, rows: list[dict[str, float]], source: str | None = None,
             n_components: int | None = None) -> SavedModel:
    """Fit a model on feature dicts (one per window, in time order), which already carry
    their context features (:class:`~eacgm_detector.context.ContextTracker` with
    ``cfg.context_windows``); features without any value are left out (:func:`learnable`).
    ``n_components``: refresh at this size, without the component search."""
    names = feature_names(rows)
    names, X = learnable(names, vectorize(rows, names), source, cfg.context_windows)
    det = model_from_config(cfg, names).fit(X, n_components=n_components)
    return SavedModel(det, names, cfg.window_s, tuple(cfg.context_windows))


def fit_table(cfg: DetectorConfig, names: list[str], X: np.ndarray, source: str | None = None) -> SavedModel:
    """Fit a model on a table of one entity's windows in time order (rows) by feature
    (``names``), its context features derived here; ``window_s`` is not recorded. Features
    without any value are left out (:func:`learnable`)."""
    Xc, names_c = add_context(X, names, cfg.context_windows)
    names_c, Xc = learnable(names_c, Xc, source, cfg.context_windows)
    return SavedModel(model_from_config(cfg, names_c).fit(Xc), names_c, None, tuple(cfg.context_windows))


def table_features(model: SavedModel, names: list[str], X: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """A time-ordered table (columns ``names``) as the model's feature matrix: its context
    features derived as in training, columns in ``model.feature_names`` order.

    Returns the matrix and the model's base features that ``names`` lacks (NaN there, so the
    model imputes them).
    """
    col = {n: i for i, n in enumerate(names)}
    base = model.base_feature_names
    missing = [n for n in base if n not in col]
    Xb = np.column_stack([X[:, col[n]] if n in col else np.full(len(X), np.nan) for n in base])
    Xc, names_c = add_context(Xb.reshape(len(X), len(base)), base, model.context_windows)
    at = {n: i for i, n in enumerate(names_c)}
    out = np.column_stack([Xc[:, at[n]] if n in at else np.full(len(X), np.nan)
                           for n in model.feature_names])
    return out.reshape(len(X), len(model.feature_names)), missing


class EntityDetector:
    """Windows, features and model of one entity."""

    def __init__(self, entity: Entity, cfg: DetectorConfig, model: SavedModel | None = None) -> None:
        self.cfg = cfg
        self.vocab = Vocabulary(max_functions=cfg.max_functions, max_metrics=cfg.max_metrics,
                                exclude_metrics=tuple(cfg.exclude_metrics))
        self.windows = EntityWindows(
            entity, window_ns=int(cfg.window_s * 1e9), grace_ns=int(cfg.grace_s * 1e9),
            function_key=self.vocab.function_key, metric_key=self.vocab.metric_key,
            max_span_refs=cfg.max_span_refs)
        self.model = model
        self._fixed = model is not None
        # A fixed model's features were derived with its own context windows.
        self.context = ContextTracker(model.context_windows if model is not None else cfg.context_windows)
        self.history: deque[dict[str, float]] = deque(maxlen=cfg.history_windows)
        self._since_fit = 0
        self.fits = 0
        self._below = 0          # consecutive windows below the threshold, up to the last one scored
        self._drift = model.detector.drift(cfg.drift_windows) if model is not None else None
        self._last_end: int | None = None
        self.last_seen = 0.0     # when data of it last came, on the Detector's clock

    def _fit(self) -> None:
        # A refit refreshes the model on the newest windows at the size the last search
        # chose; every SEARCH_EVERY-th fit (the first included) searches the size again.
        size = None if self.model is None or self.fits % SEARCH_EVERY == 0 else self.model.detector.n_components_
        self.model = fit_rows(self.cfg, list(self.history), n_components=size)
        self._since_fit = 0
        self.fits += 1
        det = self.model.detector
        # A new model scores on its own scale: the drift it follows starts over.
        self._drift = det.drift(self.cfg.drift_windows)
        # The label-free threshold is reported here, once per fit, not per window.
        log.info("%s model %d: %d windows, %d features, %d components (%s), threshold %.3f (%s)",
                 entity_label(self.windows.entity), self.fits, len(self.history),
                 len(self.model.feature_names), det.n_components_, det.covariance_type,
                 det.threshold_, det.threshold_method_)

    def score(self, win: Window) -> WindowResult:
        """Score a closed window (or learn from it while warming up)."""
        feats = self.context.augment(window_features(win))
        base = dict(entity=win.entity, start_ns=win.start_ns, end_ns=win.end_ns,
                    span_refs=win.span_refs)
        if self.model is None:
            self.history.append(feats)
            if len(self.history) >= self.cfg.warmup_windows:
                self._fit()
            return WindowResult(score=None, threshold=None, anomalous=False, **base)
        det, names = self.model.detector, self.model.feature_names
        x = vectorize([feats], names)
        score = float(det.score_samples(x)[0])
        # A run of windows below the threshold is broken by a normal window and by a gap.
        threshold, single = self._drift.current()
        below = score < threshold
        self._below = (self._below + 1 if self._last_end == win.start_ns else 1) if below else 0
        self._last_end = win.end_ns
        rule = det.rule_at(score, self._below, self.cfg.confirm_windows, threshold, single)
        anomalous = rule is not None
        self._drift.observe(score, below)
        result = WindowResult(score=score, threshold=float(threshold), anomalous=anomalous,
                              below=self._below, rule=rule, **base)
        if anomalous:
            result.top = _top_features(self.model, x, self.cfg.top_features)
            result.affected = _affected_spans(win, result.top)
        elif not below:  # a window below the threshold teaches nothing, confirmed or not
            self.history.append(feats)
            self._since_fit += 1
            if not self._fixed and self._since_fit >= self.cfg.refit_every:
                self._fit()
        return result


def _top_features(model: SavedModel, x: np.ndarray, n: int) -> list[Contribution]:
    """The ``n`` features with the largest contributions, a context feature's added to the
    feature it derives from: the person reading the event wants to know that the all-reduce
    duration moved, whether against training or against the last minute."""
    contrib = model.detector.contributions(x)[0]
    names = model.feature_names
    index = {name: i for i, name in enumerate(names)}
    total: dict[str, float] = {}
    for name, c in zip(names, contrib):
        base = base_name(name, model.context_windows)
        total[base] = total.get(base, 0.0) + float(c)
    top = sorted(total.items(), key=lambda kv: -kv[1])[:n]
    whole = sum(total.values()) or 1.0
    return [Contribution(b, feature_category(b), c, float(x[0, index[b]]) if b in index else math.nan,
                         c / whole) for b, c in top]


def _affected_spans(win: Window, top: list[Contribution]) -> list[tuple[bytes, bytes]]:
    """Slowest spans of the top contributing span feature's function, else of the window."""
    for c in top:
        if not c.name.startswith("span.") or math.isnan(c.value):
            continue
        for (layer, fn), st in win.functions.items():
            if c.name.startswith(f"span.{layer}.{fn}."):
                return [(t, s) for _, t, s in sorted(st.slowest, reverse=True)]
    every = sorted((x for st in win.functions.values() for x in st.slowest), reverse=True)
    return [(t, s) for _, t, s in every[:5]]
