"""Paired overhead measurement: every probe paused and resumed in alternating blocks.

Back-to-back runs with and without the agent cannot resolve a 5 % overhead on a host whose own
step time moves 13 % between 8-second blocks, and an agent start takes 8-10 s (issue 27). With
``pause_cycle_s`` set, the agent stays up and detaches every probe for one block, attaches it
again for the next, and so on, through the same probe links the guardrail cycles; each switch
goes to ``pause_cycle_log`` as a JSON line with its CLOCK_MONOTONIC start and end, so that a
benchmark compares a job's steps inside traced blocks with those inside the paused blocks next
to them (benchmarks/overhead_paired.py), dropping the steps that straddle a switch.

While paused, the guardrail's clock stands still and the call statistics are not read: the
guardrail sees the traced blocks only, as if the paused ones had not happened, and keeps the
duty it chose. A measurement mode: the call statistics of such a run are those of its traced
blocks, and calls in flight at a pause lose their return (their frames end as unwound).
"""

from __future__ import annotations

import bisect
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from otel_eacgm.probe_links import ProbeLinks


class PauseCycle:
    """Pauses and resumes every probe every `block_s` seconds; logs each switch."""

    def __init__(self, links: ProbeLinks, block_s: float, log_path: Path | None, now: float | None = None,
                 mark_gap: Callable[[bool], None] = lambda _on: None) -> None:
        """`mark_gap` tells the kernel when returns may come without their entries: from a
        pause until a tick after the resume (they count as cycled_returns then)."""
        self._links = links
        self._mark_gap = mark_gap
        self._gap_closing = False
        self.block_s = block_s
        self._log: TextIO | None = log_path.open("a", encoding="utf-8") if log_path else None
        self._next = float("inf") if now is None else now + block_s  # None: from the first tick
        self.paused = False
        self._paused_since = 0.0
        self._starts: list[float] = []  # closed paused intervals, and the paused time before each end
        self._ends: list[float] = []
        self._before: list[float] = []

    def tick(self, now: float) -> None:
        """Switch between paused and traced when the block is over."""
        if self._next == float("inf"):
            self._next = now + self.block_s
        if self._gap_closing:  # the calls in flight at the resume have returned
            self._gap_closing = False
            self._mark_gap(False)
        if now < self._next:
            return
        start_ns = time.monotonic_ns()
        if not self.paused:
            self._mark_gap(True)
        probes = self._links.resume() if self.paused else self._links.pause()
        self._gap_closing = self.paused
        end_ns = time.monotonic_ns()
        if self.paused:  # the probes fire again from the resume's end: paused until its start
            self._starts.append(self._paused_since)
            self._ends.append(start_ns / 1e9)
            self._before.append(self.paused_total(self._paused_since) + start_ns / 1e9 - self._paused_since)
        else:  # they fired at most until the pause's end
            self._paused_since = end_ns / 1e9
        self.paused = not self.paused
        self._next = end_ns / 1e9 + self.block_s
        if self._log is not None:
            self._log.write(json.dumps({"state": "paused" if self.paused else "traced", "start_ns": start_ns,
                                        "end_ns": end_ns, "probes": probes}) + "\n")
            self._log.flush()

    def paused_total(self, t: float) -> float:
        """Seconds paused before monotonic time `t`."""
        i = bisect.bisect_right(self._ends, t)
        total = self._before[i - 1] if i else 0.0
        if i < len(self._starts) and self._starts[i] < t:  # inside a closed pause
            total += t - self._starts[i]
        elif self.paused and t > self._paused_since and i == len(self._starts):
            total += t - self._paused_since
        return total

    def traced_time(self, t: float) -> float:
        """`t` (monotonic seconds) less the paused time before it: the guardrail's clock."""
        return t - self.paused_total(t)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
