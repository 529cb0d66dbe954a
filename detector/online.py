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
from eacgm_detector.features import (Vocabulary, feature_category, feature_names, vectorize,
                                     window_features)
from eacgm_detector.model import GMMDetector
from eacgm_detector.persist import SavedModel
from eacgm_detector.records import Entity, entity_label
from eacgm_detector.windows import EntityWindows, Window

log = logging.getLogger(__name__)


@dataclass
class Contribution:
    """One feature's part in an anomaly."""

    name: str
    category: str
    contribution: float
    value: float


@dataclass
class WindowResult:
    """The outcome for one closed window; ``score`` is None during warm-up."""

    entity: Entity
    start_ns: int
    end_ns: int
    score: float | None
    threshold: float | None
    anomalous: bool
    top: list[Contribution] = field(default_factory=list)
    affected: list[tuple[bytes, bytes]] = field(default_factory=list)
    span_refs: list[tuple] = field(default_factory=list, repr=False)


def model_from_config(cfg: DetectorConfig) -> GMMDetector:
    """A fresh estimator with the config's hyperparameters."""
    return GMMDetector(cfg.max_components, covariance_type=cfg.covariance_type,
                       reg_covar=cfg.reg_covar, threshold_method=cfg.threshold_method,
                       threshold_risk=cfg.threshold_risk, random_state=cfg.random_state)


def fit_rows(cfg: DetectorConfig, rows: list[dict[str, float]]) -> SavedModel:
    """Fit a model on feature dicts (one per window)."""
    names = feature_names(rows)
    return SavedModel(model_from_config(cfg).fit(vectorize(rows, names)), names, cfg.window_s)


class EntityDetector:
    """Windows, features and model of one entity."""

    def __init__(self, entity: Entity, cfg: DetectorConfig, model: SavedModel | None = None) -> None:
        self.cfg = cfg
        self.vocab = Vocabulary(max_functions=cfg.max_functions, max_metrics=cfg.max_metrics)
        self.windows = EntityWindows(
            entity, window_ns=int(cfg.window_s * 1e9), grace_ns=int(cfg.grace_s * 1e9),
            function_key=self.vocab.function_key, metric_key=self.vocab.metric_key,
            max_span_refs=cfg.max_span_refs)
        self.model = model
        self._fixed = model is not None
        self.history: deque[dict[str, float]] = deque(maxlen=cfg.history_windows)
        self._since_fit = 0
        self.fits = 0

    def _fit(self) -> None:
        self.model = fit_rows(self.cfg, list(self.history))
        self._since_fit = 0
        self.fits += 1
        det = self.model.detector
        # The label-free threshold is reported here, once per fit, not per window.
        log.info("%s model %d: %d windows, %d features, %d components (%s), threshold %.3f (%s)",
                 entity_label(self.windows.entity), self.fits, len(self.history),
                 len(self.model.feature_names), det.n_components_, det.covariance_type,
                 det.threshold_, det.threshold_method_)

    def score(self, win: Window) -> WindowResult:
        """Score a closed window (or learn from it while warming up)."""
        feats = window_features(win)
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
        anomalous = score < det.threshold_
        result = WindowResult(score=score, threshold=float(det.threshold_), anomalous=anomalous, **base)
        if anomalous:
            contrib = det.contributions(x)[0]
            order = np.argsort(-contrib)[: self.cfg.top_features]
            result.top = [Contribution(names[i], feature_category(names[i]), float(contrib[i]),
                                       float(x[0, i])) for i in order]
            result.affected = _affected_spans(win, result.top)
        else:
            self.history.append(feats)
            self._since_fit += 1
            if not self._fixed and self._since_fit >= self.cfg.refit_every:
                self._fit()
        return result


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
