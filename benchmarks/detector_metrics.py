"""Evaluation figures for the detector benchmark: point-wise and event-wise, with and
without a threshold. VUS-PR comes from ``tsb-ad`` when it is installed."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import average_precision_score

try:
    from TSB_AD.evaluation.metrics import generate_curve
except ImportError:  # optional: `pip install --no-deps tsb-ad`
    generate_curve = None

VUS_WINDOW = 100  # TSB-AD's default sliding window


def events(labels: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s."""
    padded = np.concatenate([[0], labels.astype(int), [0]])
    edges = np.flatnonzero(np.diff(padded))
    return list(zip(edges[::2], edges[1::2]))


def figures(labels: np.ndarray, scores: np.ndarray, flags: np.ndarray, vus: bool) -> dict[str, float]:
    """Precision, recall, F1 (point-wise, at the label-free threshold), event recall,
    AUC-PR and VUS-PR (threshold-free)."""
    labels = labels.astype(int)
    tp = int((flags & (labels == 1)).sum())
    p = tp / flags.sum() if flags.sum() else 0.0
    r = tp / labels.sum() if labels.sum() else 0.0
    ev = events(labels)
    out = {
        "P": p, "R": r, "F1": 2 * p * r / (p + r) if p + r else 0.0,
        "event R": np.mean([flags[a:b].any() for a, b in ev]) if ev else float("nan"),
        "AUC-PR": average_precision_score(labels, scores),
    }
    if vus and generate_curve is not None:
        out["VUS-PR"] = float(generate_curve(labels, np.asarray(scores, float), VUS_WINDOW, "opt", 250)[-1])
    return out
