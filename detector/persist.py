"""Saving and loading fitted models in a format that cannot execute code.

A model file is a NumPy ``.npz`` archive of plain float arrays plus one JSON document
(hyperparameters, feature names, threshold). It is read with ``allow_pickle=False``, so a
model file from an untrusted place can at worst be rejected, never run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.mixture import GaussianMixture

from eacgm_detector.model import GMMDetector

FORMAT = "eacgm-detector-model"
FORMAT_VERSION = 1
_ARRAYS = ("fill_", "center_", "scale_", "bic_", "holdout_log_likelihood_")
_MIXTURE_ARRAYS = ("weights_", "means_", "covariances_", "precisions_cholesky_", "precisions_")


@dataclass
class SavedModel:
    """A fitted detector together with the names of the features it expects, in order.

    ``window_s`` is the window length the features were computed over, when they came from
    telemetry (counts and rates depend on it); None for models fitted on a CSV.
    """

    detector: GMMDetector
    feature_names: list[str]
    window_s: float | None = None


def save_model(path: str | Path, model: SavedModel) -> None:
    """Write ``model`` to ``path`` (``.npz``)."""
    det = model.detector
    if len(model.feature_names) != det.n_features_in_:
        raise ValueError(
            f"feature_names has {len(model.feature_names)} names, the detector was fitted "
            f"on {det.n_features_in_} features"
        )
    meta = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "params": det.get_params(),
        "feature_names": list(model.feature_names),
        "n_components": int(det.n_components_),
        "threshold": float(det.threshold_),
        "threshold_method": det.threshold_method_,
        "window_s": model.window_s,
    }
    meta["params"]["random_state"] = _plain_seed(meta["params"]["random_state"])
    arrays = {name: getattr(det, name) for name in _ARRAYS}
    arrays.update({f"mixture.{n}": getattr(det.mixture_, n) for n in _MIXTURE_ARRAYS})
    with open(path, "wb") as fh:
        np.savez(fh, meta=np.array(json.dumps(meta)), **arrays)


def load_model(path: str | Path) -> SavedModel:
    """Read a model written by :func:`save_model`; raise ``ValueError`` if it is not one."""
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            arrays = {k: data[k] for k in data.files if k != "meta"}
    except (OSError, KeyError, ValueError) as exc:
        raise ValueError(f"{path}: not a detector model file ({exc})") from exc
    if meta.get("format") != FORMAT or meta.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: format {meta.get('format')!r} version {meta.get('version')!r}, "
            f"expected {FORMAT!r} version {FORMAT_VERSION}"
        )
    det = GMMDetector(**meta["params"])
    for name in _ARRAYS:
        setattr(det, name, arrays[name])
    gm = GaussianMixture(
        n_components=meta["n_components"],
        covariance_type=det.covariance_type,
        reg_covar=det.reg_covar,
    )
    for name in _MIXTURE_ARRAYS:
        setattr(gm, name, arrays[f"mixture.{name}"])
    gm.converged_, gm.n_iter_, gm.lower_bound_ = True, 0, -np.inf
    det.mixture_ = gm
    det.n_components_ = meta["n_components"]
    det.n_features_in_ = len(meta["feature_names"])
    det.threshold_ = det.offset_ = meta["threshold"]
    det.threshold_method_ = meta["threshold_method"]
    det.n_iter_ = 0
    return SavedModel(det, list(meta["feature_names"]), meta.get("window_s"))


def _plain_seed(seed):
    """A JSON-able ``random_state``: ints stay, generator objects become None."""
    return int(seed) if isinstance(seed, (int, np.integer)) else None
