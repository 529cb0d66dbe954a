"""A sample shared by the several instruments that one collection reads.

One OTel collection calls every observable callback back to back. Network and InfiniBand
instruments all come from one file read (``/proc/net/dev``) or one sysfs walk, so the first
callback of a collection reads and the others reuse that read instead of repeating it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

#: Reuse a sample for at most this long; far below any sensible export interval (>= 1 s), far
#: above the time one collection takes to run all callbacks.
DEFAULT_MAX_AGE_S = 0.25


class CachedSample(Generic[T]):
    """Call ``read`` at most once per ``max_age_s``; callers within that window share the value."""

    def __init__(
        self,
        read: Callable[[], T],
        *,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_age_s < 0:
            raise ValueError(f"max_age_s={max_age_s!r} must be >= 0")
        self._read = read
        self._max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._value: T | None = None
        self._taken_at: float | None = None

    def get(self) -> T:
        """Return the current sample, reading a new one if the last is older than ``max_age_s``."""
        with self._lock:
            now = self._clock()
            if self._taken_at is None or now - self._taken_at > self._max_age_s:
                self._value = self._read()
                self._taken_at = now
            return self._value  # type: ignore[return-value]
