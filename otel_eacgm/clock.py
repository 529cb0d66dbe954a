"""Monotonic (bpf_ktime_get_ns) to wall-clock epoch nanoseconds."""

from __future__ import annotations

import time


class EpochClock:
    """Converts CLOCK_MONOTONIC stamps to epoch ns with an offset measured at start.

    The offset is sampled several times and the tightest bracket kept, so the error is a
    couple of microseconds; `resync()` re-measures it (NTP may slew the wall clock).
    """

    def __init__(self) -> None:
        self.offset_ns = self._measure()

    @staticmethod
    def _measure(samples: int = 9) -> int:
        best: tuple[int, int] | None = None
        for _ in range(samples):
            m0 = time.monotonic_ns()
            wall = time.time_ns()
            m1 = time.monotonic_ns()
            width = m1 - m0
            if best is None or width < best[0]:
                best = (width, wall - (m0 + m1) // 2)
        assert best is not None
        return best[1]

    def resync(self) -> None:
        """Measure the offset again."""
        self.offset_ns = self._measure()

    def to_epoch(self, monotonic_ns: int) -> int:
        """Epoch nanoseconds for a CLOCK_MONOTONIC stamp."""
        return monotonic_ns + self.offset_ns
