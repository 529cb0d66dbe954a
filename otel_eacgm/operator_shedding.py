"""Operator shedding: stop probing ATen operators whose probe hits cost more than they tell.

Probing an operator costs two hits a call (entry and exit). For a view or a scalar add called
hundreds of thousands of times a second and lasting a microsecond, the probes cost a large
share of the thread and its spans tell little: the time is in its callers' spans anyway. Once
per statistics read, each probed operator of each traced process is measured from the
kernel's call statistics (the same numbers the guardrail reads): it is shed when its probes
cost at least `share` of a thread (calls per second x 2 hits x the guardrail's cost per hit)
and each call lasts less than TINY_HITS times what its two hits cost. Shedding is for good,
for every process (probes are per file): its entry probes are linked out at once and its exit
probes one tick later, through the same uprobe_multi links the guardrail cycles, so a call in
flight is still seen whole. Until the old exit links stop firing, a return may come without its
entry (a call of the shed operator made after its entry went, or a kept operator's return seen
by both exit links): the kernel counts those as cycled_returns, not unmatched_returns. One log
line names what was shed with its rate; the gauge ``eacgm.agent.operators.shed`` keeps saying
it (the calls per second each had when shed). The statistics of a shed operator stop growing
from then on: its calls are not counted any more.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

from otel_eacgm.bpf_program import CallStat
from otel_eacgm.probe_links import Detached, GroupKind, ProbeLinks
from otel_eacgm.probes.catalog import Layer, ProbeSpec

log = logging.getLogger(__name__)

TINY_HITS = 5.0  # a call shorter than this many times its two probe hits is tiny
MIN_CALLS = 200  # calls a window must hold to judge an operator


@dataclasses.dataclass(frozen=True)
class Shed:
    """One shed operator: what it cost when it was shed."""

    name: str
    calls_per_s: float
    mean_s: float
    cost_share: float


class OperatorShedder:
    """Sheds high-rate tiny operators (see the module docstring)."""

    def __init__(self, links: ProbeLinks, rows: Mapping[int, ProbeSpec], *, share: float,
                 hit_cost: Callable[[int], float], now: float,
                 mark_gap: Callable[[bool], None] = lambda _on: None) -> None:
        """`mark_gap` tells the kernel when returns may come without their entries: from a shed
        until the old exit links stop firing."""
        self._links = links
        self._mark_gap = mark_gap
        self._exits_gone: Detached | None = None  # the last exit re-link, until its old links stop
        self._rows = rows
        self.share = share
        self._hit_cost = hit_cost
        self._last: dict[tuple[int, int], tuple[int, int, int]] = {}  # (pid, slot) -> count, timed, sum_ns
        self._last_t = now
        self._exits_due: set[int] = set()
        self.shed: dict[int, Shed] = {}  # slot -> what it cost when shed

    def tick(self) -> None:
        """Unlink the exit probes of operators whose entries were unlinked at the last read; end
        the gap once the old exit links have stopped firing."""
        if self._exits_gone is not None and self._exits_gone.stopped_at is not None:
            self._exits_gone = None
            self._mark_gap(False)
        if self._exits_due:
            self._exits_gone = self._links.drop(GroupKind.TORCH_EXIT, self._exits_due)
            self._exits_due = set()

    def observe(self, entries: Sequence[CallStat], now: float,
                scale: Mapping[tuple[int, int], float] | None = None) -> None:
        """One read of the kernel's statistics: shed what costs more than it tells. `scale`
        extrapolates the counts of probes the guardrail cycles (their rate, not the share of it
        counted while attached, is what they cost with the probes on)."""
        window, self._last_t = now - self._last_t, now
        totals: dict[tuple[int, int], list[int]] = {}
        for e in entries:
            spec = self._rows.get(e.probe_id)
            if spec is None or spec.layer is not Layer.TORCH or e.probe_id in self.shed:
                continue
            t = totals.setdefault((e.pid, e.probe_id), [0, 0, 0])
            t[0], t[1], t[2] = t[0] + e.count, t[1] + e.timed, t[2] + e.sum_ns
        last, self._last = self._last, {k: (c, n, s) for k, (c, n, s) in totals.items()}
        if window <= 0 or self.share <= 0 or not self._links.multi_links:
            return
        found: dict[int, Shed] = {}
        for (pid, slot), (count, timed, sum_ns) in totals.items():
            c0, n0, s0 = last.get((pid, slot), (0, 0, 0))
            calls, timed_calls, ns = count - c0, timed - n0, sum_ns - s0
            if calls < MIN_CALLS or timed_calls <= 0:
                continue
            per_call = 2 * self._hit_cost(pid)
            rate, mean_s = calls * (scale or {}).get((pid, slot), 1.0) / window, ns / timed_calls * 1e-9
            cost = rate * per_call
            if cost >= self.share and mean_s < TINY_HITS * per_call:
                best = found.get(slot)
                if best is None or cost > best.cost_share:
                    found[slot] = Shed(self._rows[slot].symbol, rate, mean_s, cost)
        if not found:
            return
        self._mark_gap(True)
        self._links.drop(GroupKind.TORCH, set(found))
        self._exits_due |= set(found)
        self.shed.update(found)
        named = sorted(found.values(), key=lambda s: -s.cost_share)
        log.info("shed %d high-rate tiny operators, their probes cost more than their spans tell: %s; no longer "
                 "probed or counted, their time shows in their callers' spans (gauge eacgm.agent.operators.shed; "
                 "torch_shed_share %.3g, 0 turns shedding off)", len(named),
                 ", ".join(f"{s.name} ({s.calls_per_s:.0f} calls/s of {1e6 * s.mean_s:.1f} us, probes "
                           f"{100 * s.cost_share:.1f}% of a thread)" for s in named), self.share)

    def shed_rates(self) -> dict[str, float]:
        """Calls per second of each shed operator when it was shed (eacgm.agent.operators.shed)."""
        rates: dict[str, float] = {}
        for s in self.shed.values():  # overloads of one operator add up
            rates[s.name] = rates.get(s.name, 0.0) + s.calls_per_s
        return rates
