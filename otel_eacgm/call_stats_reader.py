"""Reading the kernel's call statistics into the metric snapshot, on the agent's loop.

They are read every half metric interval, which keeps the exported counts fresh, and sooner
(half a guardrail period) while the overhead guardrail runs, so a launch-bound job is throttled
within a second or two. While the guardrail cycles probes, a read happens at the end of each of
its periods instead: the counts of a whole attached/detached cycle are what it extrapolates.
"""

from __future__ import annotations

from otel_eacgm.bpf_program import CallProgram
from otel_eacgm.guardrail import Guardrail
from otel_eacgm.metrics.call_stats import CallStatistics
from otel_eacgm.pause_cycle import PauseCycle
from otel_eacgm.operator_shedding import OperatorShedder


class CallStatsReader:
    """Folds the kernel's entries into `call_stats` (scaled by the guardrail), lets the operator
    shedder judge them, and frees the entries of processes gone for two metric intervals (after
    their last counts went out)."""

    def __init__(self, program: CallProgram, call_stats: CallStatistics, guardrail: Guardrail | None, *,
                 metrics_interval_s: float, guardrail_period_s: float, shedder: OperatorShedder | None = None,
                 pause: PauseCycle | None = None) -> None:
        """With `pause`, nothing is read while the probes are paused, and the guardrail runs on
        the traced time (pause_cycle.py)."""
        self._program = program
        self._pause = pause
        self._call_stats = call_stats
        self._guardrail = guardrail
        self._shedder = shedder
        self._keep_s = 2 * metrics_interval_s
        self._every_s = metrics_interval_s / 2 if guardrail is None \
            else min(metrics_interval_s / 2, guardrail_period_s / 2)
        self._next = float("-inf")
        self._forget: list[tuple[float, int]] = []  # (when, pid)

    @property
    def poll_timeout_ms(self) -> int:
        """How long the loop may wait for records: short while cycled exit probes are due."""
        return 10 if self._guardrail is not None and self._guardrail.exits_pending else 100

    def forget_later(self, pid: int, now: float) -> None:
        """`pid` exited: free its entries once its last counts were exported."""
        self._forget.append((now + self._keep_s, pid))

    def tick(self, now: float) -> None:
        """The guardrail's tick, then a read if one is due."""
        if self._pause is not None and self._pause.paused:
            return
        if self._shedder is not None:
            self._shedder.tick()
        period_done = self._guardrail.tick(self._clock(now)) if self._guardrail is not None else False
        cycling = self._guardrail is not None and self._guardrail.cycling
        if period_done if cycling else now >= self._next:
            self._next = now + self._every_s
            self.read(now)

    def _clock(self, now: float) -> float:
        return self._pause.traced_time(now) if self._pause is not None else now

    def read(self, now: float) -> None:
        """Fold the entries into the snapshot now; free those of processes gone long enough."""
        gone = {pid for t, pid in self._forget if t <= now}
        entries = self._program.call_stats()
        scale = self._guardrail.observe(entries, self._clock(now)) if self._guardrail is not None else None
        self._call_stats.update(entries, scale)
        if self._shedder is not None:
            self._shedder.observe(entries, self._clock(now), scale)
        if gone:
            self._forget = [(t, pid) for t, pid in self._forget if pid not in gone]
            for pid in gone:
                self._call_stats.forget(pid)
            self._program.forget_stats(gone)
