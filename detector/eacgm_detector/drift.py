"""A threshold that follows normal drift of an entity's scores downward.

Normal windows of a later period can score far below the held-out windows the threshold was
set on: on 9 of JumpStarter's 15 first-half entities 17 to 49 % of normal test windows fell
below a threshold that allows 0.8 %. ``DriftThreshold`` lowers the threshold by as much as the
median score of the entity's last ``windows`` windows that were not below it lies below the
median held-out score. It never raises the threshold (a model that fits the present
better than its training is no reason to flag more), flagged windows do not move it (an
anomaly cannot hide itself by lowering the bar), and it waits for ``MIN_WINDOWS`` of them
(or ``windows``, if fewer) before it moves at all, so a process's first windows, and the
GPU fault runs' faults in their first windows, are judged by the fitted threshold alone.
"""

from __future__ import annotations

from collections import deque

import numpy as np

#: Windows not flagged that must have been seen before the threshold follows their median.
MIN_WINDOWS = 30


class DriftThreshold:
    """One entity's current threshold (and single-window threshold) under drift.

    ``median`` is the model's median held-out score (``GMMDetector.holdout_median_``); None
    (a model file that does not know it) or ``windows`` 0 keeps the fitted thresholds.
    """

    def __init__(self, threshold: float, single_threshold: float, median: float | None,
                 windows: int) -> None:
        if windows < 0:
            raise ValueError(f"drift windows {windows!r}: expected >= 0")
        self.threshold, self.single_threshold, self.median = threshold, single_threshold, median
        self.windows = windows
        self._recent: deque[float] = deque(maxlen=max(windows, 1))

    def drop(self) -> float:
        """How far the thresholds are lowered now (>= 0)."""
        if self.median is None or self.windows == 0 or len(self._recent) < min(self.windows, MIN_WINDOWS):
            return 0.0
        return max(0.0, self.median - float(np.median(self._recent)))

    def current(self) -> tuple[float, float]:
        """The threshold and the single-window threshold a window is compared with now."""
        d = self.drop()
        return self.threshold - d, self.single_threshold - d

    def observe(self, score: float, flagged: bool) -> None:
        """Record a scored window; only windows that were not below the threshold
        (``flagged`` False) count."""
        if not flagged and self.windows:
            self._recent.append(float(score))
