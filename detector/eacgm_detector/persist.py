"""Saving and loading fitted models in a format that cannot execute code.

A model file is a NumPy ``.npz`` archive of plain float arrays plus one JSON document
(hyperparameters, feature names, threshold, window length, context windows). It is read with
``allow_pickle=False``, so a model file from an untrusted place can at worst be rejected,
never run. Version 1 files (before context features) still load, with no context windows,
version 1 and 2 files with a single-window threshold that is the threshold, and files before
version 4 without the median held-out score (their threshold does not follow drift).
"""

from __future__ import annotations

import json
import math
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.mixture import GaussianMixture

from eacgm_detector.atomic import atomic_write
from eacgm_detector.context import base_name, check_windows
from eacgm_detector.model import GMMDetector

FORMAT = "eacgm-detector-model"
FORMAT_VERSION = 4
#: Versions ``load_model`` reads: 1 has no ``context_windows`` (its models used none), 1 and 2
#: no ``single_threshold`` (it is then the threshold: every window below it is reported alone),
#: 1 to 3 no ``holdout_median`` (the threshold then stays where the fit put it).
READABLE_VERSIONS = (1, 2, 3, 4)
_ARRAYS = ("fill_", "center_", "scale_", "bic_", "holdout_log_likelihood_")
_MIXTURE_ARRAYS = ("weights_", "means_", "covariances_", "precisions_cholesky_", "precisions_")


@dataclass
class SavedModel:
    """A fitted detector together with the names of the features it expects, in order.

    ``window_s`` is the window length the features were computed over, when they came from
    telemetry (counts and rates depend on it); None for models fitted on a CSV.
    ``context_windows`` are the spans of the context features among ``feature_names``
    (:mod:`eacgm_detector.context`): whoever scores with the model must derive them the same
    way, so the model carries them.
    """

    detector: GMMDetector
    feature_names: list[str]
    window_s: float | None = None
    context_windows: tuple[int, ...] = ()

    @property
    def base_feature_names(self) -> list[str]:
        """The features the context features derive from, in first-seen order: what an
        input must provide."""
        return list(dict.fromkeys(base_name(n, self.context_windows) for n in self.feature_names))


def save_model(path: str | Path, model: SavedModel) -> None:
    """Write ``model`` to ``path`` (``.npz``), atomically: on any failure a model that was at
    ``path`` stays as it was (:func:`~eacgm_detector.atomic.atomic_write`)."""
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
        "single_threshold": float(det.single_threshold_),
        "holdout_median": float(det.holdout_median_),
        "threshold_method": det.threshold_method_,
        "window_s": model.window_s,
        "context_windows": list(check_windows(model.context_windows)),
    }
    meta["params"]["random_state"] = _plain_seed(meta["params"]["random_state"])
    arrays = {name: getattr(det, name) for name in _ARRAYS}
    arrays.update({f"mixture.{n}": getattr(det.mixture_, n) for n in _MIXTURE_ARRAYS})
    # Beside the target, then renamed over it: a full disk or a kill leaves the old model.
    with atomic_write(path) as fh:
        np.savez(fh, meta=np.array(json.dumps(meta)), **arrays)


def load_model(path: str | Path) -> SavedModel:
    """Read a model written by :func:`save_model`; raise ``ValueError`` if it is not one.

    Everything in the file is checked before use (a model path is input like any other):
    the JSON document's fields and types, every array's presence, dtype and shape, so that a
    damaged or hostile file is refused here with its path named, never later while scoring.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError("a single array, not an .npz archive")
            meta = json.loads(str(data["meta"]))
            arrays = {k: data[k] for k in data.files if k != "meta"}
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, zlib.error,
            NotImplementedError, RuntimeError) as exc:
        # zipfile raises NotImplementedError for a damaged compression method, version or
        # flag field, and RuntimeError for a set encryption bit: damage like any other.
        raise ValueError(f"{path}: not a detector model file ({exc})") from exc
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: not a detector model file (meta is {type(meta).__name__}, not an object)")
    if meta.get("format") != FORMAT or meta.get("version") not in READABLE_VERSIONS:
        raise ValueError(
            f"{path}: format {meta.get('format')!r} version {meta.get('version')!r}, "
            f"expected {FORMAT!r} version {' or '.join(map(str, READABLE_VERSIONS))}"
        )
    try:
        return _restore(meta, arrays)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: damaged detector model file ({type(exc).__name__}: {exc})") from exc


def _restore(meta: dict, arrays: dict[str, np.ndarray]) -> SavedModel:
    names = meta["feature_names"]
    k = meta["n_components"]
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
        raise ValueError("feature_names must be a non-empty list of strings")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"n_components {k!r} must be a positive integer")
    if not isinstance(meta["params"], dict):
        raise ValueError("params must be an object")
    for name, arr in arrays.items():
        if arr.dtype.kind not in "fiu":
            raise ValueError(f"array {name!r} has dtype {arr.dtype}, expected numbers")
    # A file written before spike_floor existed was fitted without it (its units say so).
    det = GMMDetector(**{"spike_floor": 0.0, **meta["params"]})
    d = len(names)
    cov_shape = {"full": (k, d, d), "tied": (d, d), "diag": (k, d), "spherical": (k,)}.get(det.covariance_type)
    if cov_shape is None:
        raise ValueError(f"covariance_type {det.covariance_type!r} unknown")
    shapes = {"fill_": (d,), "center_": (d,), "scale_": (d,), "mixture.weights_": (k,),
              "mixture.means_": (k, d), "mixture.covariances_": cov_shape,
              "mixture.precisions_cholesky_": cov_shape, "mixture.precisions_": cov_shape}
    for name, shape in shapes.items():
        if arrays[name].shape != shape:
            raise ValueError(f"array {name!r} has shape {arrays[name].shape}, expected {shape}")
        if not np.all(np.isfinite(arrays[name])):
            raise ValueError(f"array {name!r} has non-finite values")
    for name in _ARRAYS:
        setattr(det, name, arrays[name])
    gm = GaussianMixture(n_components=k, covariance_type=det.covariance_type, reg_covar=det.reg_covar)
    for name in _MIXTURE_ARRAYS:
        setattr(gm, name, arrays[f"mixture.{name}"])
    gm.converged_, gm.n_iter_, gm.lower_bound_ = True, 0, -np.inf
    det.mixture_ = gm
    det.n_components_ = k
    det.n_features_in_ = d
    det.threshold_ = det.offset_ = float(meta["threshold"])
    if not math.isfinite(det.threshold_):
        raise ValueError(f"threshold {det.threshold_!r} is not finite")
    det.single_threshold_ = det.threshold_ if meta["version"] < 3 else float(meta["single_threshold"])
    if not math.isfinite(det.single_threshold_):
        raise ValueError(f"single_threshold {det.single_threshold_!r} is not finite")
    median = None if meta["version"] < 4 else meta.get("holdout_median")
    if meta["version"] >= 4 and not (isinstance(median, (int, float)) and math.isfinite(median)):
        raise ValueError(f"holdout_median {median!r} must be a finite number")
    det.holdout_median_ = None if median is None else float(median)
    det.threshold_method_ = str(meta["threshold_method"])
    det.n_iter_ = 0
    window_s = meta.get("window_s")
    if window_s is not None and not (isinstance(window_s, (int, float)) and math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"window_s {window_s!r} must be a positive number")
    context = meta.get("context_windows", [])
    if not isinstance(context, list):
        raise ValueError(f"context_windows {context!r} must be a list of window counts")
    return SavedModel(det, list(names), window_s, check_windows(context))


def _plain_seed(seed):
    """A JSON-able ``random_state``: ints stay, generator objects become None."""
    return int(seed) if isinstance(seed, (int, np.integer)) else None
