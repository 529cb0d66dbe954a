"""A sample shared by the several instruments that one collection reads.

One OTel collection calls every observable callback once, back to back. Network and InfiniBand
instruments all come from one file read (``/proc/net/dev``) or one sysfs walk, so the first
callback of a collection reads and the others reuse that read. A new collection is recognised
by a consumer asking a second time, not by a clock, so two collections close together (a
periodic export then a ``force_flush``) never get a stale sample.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class CachedSample(Generic[T]):
    """Call ``read`` once per round; a round ends when any consumer asks again."""

    def __init__(self, read: Callable[[], T]) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._value: T | None = None
        self._served: set[Hashable] | None = None

    def get(self, consumer: Hashable) -> T:
        """The current round's sample, reading a new one if ``consumer`` already had this one."""
        with self._lock:
            if self._served is None or consumer in self._served:
                self._value = self._read()
                self._served = set()
            self._served.add(consumer)
            return self._value  # type: ignore[return-value]
