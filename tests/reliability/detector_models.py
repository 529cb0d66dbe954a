"""Small fitted detector models written to disk, for detectors started with --model."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from eacgm_detector.config import DetectorConfig
from eacgm_detector.online import model_from_config
from eacgm_detector.persist import SavedModel, save_model

#: Features the synthetic telemetry of these tests produces (docs/detector.md names).
FEATURES = ["span.cuda.runtime.cudaLaunchKernel.count", "span.cuda.runtime.cudaLaunchKernel.log_duration.mean",
            "metric.hw.gpu.utilization.mean"]


def write_model(path: Path, window_s: float = 1.0, seed: int = 0) -> Path:
    """A model fitted on 300 normal windows around (50 launches, 10 us each, 80 % GPU)."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.normal(50, 5, 300), rng.normal(np.log(1e-5), 0.2, 300), rng.normal(0.8, 0.03, 300)])
    detector = model_from_config(DetectorConfig(max_components=2)).fit(X)
    save_model(path, SavedModel(detector, list(FEATURES), window_s))
    return path
