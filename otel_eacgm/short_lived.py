"""Processes that exited before their probes could be linked: counted, not reported as errors.

Per-process probes (the Python layer's, scoped to each traced interpreter) are linked when the
agent finds the process, and a child that lives a few milliseconds is often gone by then:
`import torch` forks and execs `ldconfig -p`, and the kernel refuses a link for a pid that no
longer exists (ESRCH). Nothing the user asked for is lost: the process made no call worth a
span. Each such process is logged at DEBUG; an INFO line sums them up at most once per
`summary_interval_s`, so a job that forks thousands of helpers writes a handful of lines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class ShortLivedProcesses:
    """Counts processes gone before their probes were linked; rate-limits the INFO summary."""

    def __init__(self, summary_interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.count = 0
        self._interval = summary_interval_s
        self._clock = clock
        self._reported = 0
        self._next_summary = float("-inf")

    def note(self, pid: int, path: str, reason: object) -> None:
        """`pid` (which mapped `path`) exited before its probes could be linked."""
        self.count += 1
        log.debug("pid %d exited before its probes on %s could be linked: %s", pid, path, reason)
        now = self._clock()
        if now >= self._next_summary:
            self._next_summary = now + self._interval
            new, self._reported = self.count - self._reported, self.count
            log.info("%d short-lived process(es) exited before their probes could be linked (%d in all, latest pid "
                     "%d of %s); nothing of theirs is traced, nothing else is affected; at most one such line per "
                     "%.0f s, each one at DEBUG", new, self.count, pid, path, self._interval)
