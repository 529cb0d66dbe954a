"""Overhead guardrail: keep what the probes cost a traced process within a budget.

Every probe hit traps the traced thread into the kernel (about 0.7 us on the H200 host, several
on VMs), so a launch-bound loop pays for each kernel launch and each traced operator. The agent
knows each probe's hit rate from the kernel's call statistics, and estimates a process' cost as
the sum of its hits per second times ``probe_hit_cost_us``, a share of one thread's time (an
upper bound for a process whose calls are spread over several threads). When that estimate
exceeds ``overhead_budget``, the cyclable probe groups are duty-cycled: attached for a share d
of every ``guardrail_period_s`` and detached for the rest, with d chosen to bring the estimate
to ``AIM`` of the budget. The margin is for what the estimate cannot see (a hit's cost moves
with the host from one second to the next, and a step's calls with the workload): a duty set
to meet the budget exactly overran it by a few percent in one H200 round of six. A duty is kept
while its estimated cost stays within the budget, and changed as soon as it does not; a
change towards more tracing waits until it is worth one (``RELAX``). A detached uprobe costs
nothing; the BPF program that stays loaded costs nothing either.

Three groups can be cycled. Kernel launches (entry-only catalog rows) always: no return probe
can be left waiting for a call entered before the detach. PyTorch operators, and the calls
that only enqueue work on a stream and have a return probe (memsets, device-to-device copies:
the catalog's ``cyclable`` rows), when the probes are uprobe_multi links
(probe_links.ProbeLinks.multi_links), whose detach costs one kernel synchronisation instead of
one per probe: their entries are detached first and their return probes one agent tick later,
and the returns are attached again before the entries, so a call is seen whole or not at all;
a frame whose return came during the gap is closed by the kernel's stack check as unwound.
Memsets were two thirds of what the uncycled probes cost a launch-bound GPT-2 step on an H100
(58 of 87 calls a step, 2026-12-06). Probes that wait for the device (synchronisation, host
copies, NCCL), allocations and Python functions are never cycled. When they alone exceed the
budget, the guardrail says so once and cycles the others at their minimum share; turning
layers off is then the user's choice.

What a hit costs depends on the host and the moment (0.7 to 6 us on one H200 VM within an hour),
so ``probe_hit_cost_us`` is a floor, not the figure: while probes are cycled, each period
compares the traced process' rate of uncycled calls (synchronisations, NCCL: attached all the
time) in its attached and detached phases. Slowed by a share c while the cycled probes were
on, the process paid c of its time for their hits, so a hit cost c / (cycled hits per second);
the lower median of the last few periods' figures, when above the configured cost, is the cost
the estimates use (gauge ``eacgm.agent.probe.hit_cost``). A median, because the workload's own
changes of pace land in one phase or the other: a straggler's slow step in an attached phase
read as 91 us a hit on the H100. A process that waits on its GPU is not slowed and keeps the
configured cost.

While a group is cycled its statistics are extrapolated: what a probe counted in a stats
window is divided by the share of the window its group was attached (the gauge
``eacgm.agent.probe.duty`` names the probes concerned). For a steady loop this is unbiased; a
workload whose rate changes within a period is estimated from the attached parts only, and the
error of a count is about its square root times the extrapolation factor (docs/design.md).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from otel_eacgm.bpf_program import CallStat
from otel_eacgm.probe_links import Detached, GroupKind, ProbeLinks, releases_running
from otel_eacgm.probes.catalog import Layer, ProbeSpec

log = logging.getLogger(__name__)

MAX_SLOWDOWN = 0.9  # the largest probe share of attached phases the extrapolation corrects for
MIN_ATTACHED_S = 0.25  # s: an attached phase spans a few of the agent's 0.1 s ticks at least
MIN_PHASE_CALLS = 20  # uncycled calls each phase must hold to measure a slowdown (a few % of noise)
COST_PERIODS = 5  # periods whose measured hit costs the median is taken over
COST_MIN_PERIODS = 2  # measured periods before the measured cost is used
AIM = 0.8  # share of the budget a duty is chosen to cost, and below which full tracing comes back
RELAX = 1.2  # a throttled duty is raised only to at least this many times itself


@dataclasses.dataclass(frozen=True)
class _Unit:
    """Probe groups cycled together: `entries`, and `exits` (detached one tick after them)."""

    entries: GroupKind
    exits: GroupKind | None = None


_LAUNCHES = _Unit(GroupKind.LAUNCH)
_OPERATORS = _Unit(GroupKind.TORCH, GroupKind.TORCH_EXIT)
_ENQUEUES = _Unit(GroupKind.ENQUEUE, GroupKind.ENQUEUE_RETURN)


@dataclasses.dataclass
class _Cycled:
    """A throttled unit's attach history, to know its attached share of any window."""

    attached: bool = True
    exits_attached: bool = True
    since: float = 0.0
    # closed attached intervals: from the attach to when the detach took effect (probe_links.Detached)
    spans: list[tuple[float, Callable[[], float | None]]] = dataclasses.field(default_factory=list)

    def share(self, t0: float, t1: float) -> float:
        if t1 <= t0:
            return 1.0
        on = 0.0
        for a, stopped_at in self.spans:
            b = stopped_at()
            on += max(0.0, min(t1 if b is None else b, t1) - max(a, t0))  # None: still firing at t1
        if self.attached:
            on += max(0.0, t1 - max(self.since, t0))
        return min(on, t1 - t0) / (t1 - t0)

    def forget_before(self, t: float) -> None:
        self.spans = [(a, stopped_at) for a, stopped_at in self.spans if (b := stopped_at()) is None or b > t]


def _hits(spec: ProbeSpec | None) -> int:
    """Probe hits per call: 1 for an entry-only probe, 2 with a return probe (or exit probes)."""
    return 1 if spec is not None and not spec.has_return and not spec.exit_probes else 2


def unit_of(spec: ProbeSpec | None, multi_links: bool) -> _Unit | None:
    """The probe groups `spec`'s probes are cycled with, None for probes never cycled: launches
    always, operators and enqueue calls with probe links (see the module docstring)."""
    if spec is None:
        return None
    if spec.layer is Layer.TORCH:
        return _OPERATORS if multi_links else None
    if spec.cyclable:
        return _ENQUEUES if multi_links else None
    return _LAUNCHES if _hits(spec) == 1 else None


class Guardrail:
    """Estimates each process' probe cost and duty-cycles launch and operator probes past the budget."""

    def __init__(self, links: ProbeLinks, rows: Mapping[int, ProbeSpec], *, read_stats: Callable[[], list[CallStat]],
                 budget: float, hit_cost_s: float, period_s: float, min_duty: float, now: float,
                 mark_gap: Callable[[bool], None] = lambda _on: None,
                 clock: Callable[[float], float] = lambda t: t) -> None:
        """`mark_gap` tells the kernel when cycled entries are detached while their returns may
        still fire (its returns then count as cycled_returns, not unmatched); `clock` maps
        monotonic seconds to the guardrail's time (pause_cycle.PauseCycle leaves paused blocks out)."""
        self._links = links
        self._mark_gap = mark_gap
        self._clock = clock
        self._read_stats = read_stats
        self._rows = rows
        self.budget = budget
        self.hit_cost_s = hit_cost_s
        self.period_s = period_s
        self.min_duty = min_duty
        self.duty = 1.0
        self._cycle_start = now
        self._last_observe = now
        self._last_counts: dict[tuple[int, int], int] = {}
        self._cycled: dict[_Unit, _Cycled] = {}
        self._slots: dict[_Unit, set[int]] = {}  # slots seen hot in each cycled unit
        self.estimates: dict[int, float] = {}    # pid -> estimated cost share with every probe attached
        self._measured: dict[int, deque[float]] = {}  # pid -> its last periods' measured costs per hit, s
        self._at_detach: tuple[float, dict[tuple[int, int], int]] | None = None  # (time, counts) when last detached
        self._gap_closing = False  # entries were attached again this tick: the gap ends at the next
        self._warned_fixed = False
        self._warned_release = False
        self._warned_cost: set[int] = set()

    # --- measurement ----------------------------------------------------------------------
    def observe(self, entries: Sequence[CallStat], now: float) -> dict[tuple[int, int], float]:
        """Take one read of the kernel's statistics: update the estimates and the duty, and
        return per (pid, probe) the factor that extrapolates this window's counts."""
        t0, self._last_observe = self._last_observe, now
        window = now - t0
        shares = {unit: share for unit, c in self._cycled.items() if (share := c.share(t0, now)) < 0.999}
        counts = self._totals(entries)
        gains = {key: n - self._last_counts.get(key, 0) for key, n in counts.items()}
        self._measure(counts, t0, now)
        scale = self._extrapolation(gains, shares, window)
        blind = any(share * window < 0.05 for share in shares.values())
        per_pid: dict[int, list[tuple[ProbeSpec | None, int, float]]] = {}
        for (pid, slot), gained in gains.items():
            if gained > 0 and window > 0:
                rate = gained * scale.get((pid, slot), 1.0) / window
                per_pid.setdefault(pid, []).append((self._rows.get(slot), slot, rate))
        self._last_counts = counts
        if window > 0 and not blind:  # a window the cycled probes barely saw tells nothing of their rate
            if self.duty >= 1.0 and releases_running():
                if not self._warned_release:
                    self._warned_release = True
                    log.info("guardrail: an earlier agent's probes are still being released; no probe is cycled before that ends")
            else:
                self._decide(per_pid)
        for c in self._cycled.values():
            c.forget_before(now - 10 * max(self.period_s, window))
        return scale

    @staticmethod
    def _totals(entries: Sequence[CallStat]) -> dict[tuple[int, int], int]:
        counts: dict[tuple[int, int], int] = {}
        for e in entries:
            counts[(e.pid, e.probe_id)] = counts.get((e.pid, e.probe_id), 0) + e.count
        return counts

    def _measure(self, counts: Mapping[tuple[int, int], int], t0: float, now: float) -> None:
        """Update each process' measured cost per hit from the period that ends now: attached
        from ``t0`` to the last detach, detached after it (see the module docstring)."""
        at = self._at_detach
        self._at_detach = None
        pids = {pid for pid, _ in counts}
        self._measured = {pid: v for pid, v in self._measured.items() if pid in pids}
        if at is None or not t0 + MIN_ATTACHED_S / 2 < at[0] < now - MIN_ATTACHED_S / 2:
            return
        t_detach, mid = at
        fixed: dict[int, list[int]] = {}  # pid -> [uncycled calls attached, detached]
        cycled_hits: dict[int, int] = {}
        for (pid, slot), n in counts.items():
            before, between = self._last_counts.get((pid, slot), 0), mid.get((pid, slot))
            if between is None:
                continue
            spec = self._rows.get(slot)
            if self._unit_of(spec) is None:
                phases = fixed.setdefault(pid, [0, 0])
                phases[0] += between - before
                phases[1] += n - between
            else:
                cycled_hits[pid] = cycled_hits.get(pid, 0) + (between - before) * _hits(spec)
        for pid, (attached, detached) in fixed.items():
            if attached < MIN_PHASE_CALLS or detached < MIN_PHASE_CALLS or not cycled_hits.get(pid):
                continue
            # signed: a phase the workload itself sped up must weigh against one it slowed down
            slowdown = 1.0 - (attached / (t_detach - t0)) / (detached / (now - t_detach))
            self._measured.setdefault(pid, deque(maxlen=COST_PERIODS)).append(slowdown * (t_detach - t0) / cycled_hits[pid])
            measured = self._measured_cost(pid)
            if measured is not None and measured > 1.25 * self.hit_cost_s and pid not in self._warned_cost:
                self._warned_cost.add(pid)
                log.warning("guardrail: a probe hit costs pid %d about %.1f us here (measured from its slowdown while "
                            "the cycled probes were attached), more than probe_hit_cost_us %.1f; the estimates use "
                            "the measured cost", pid, 1e6 * measured, 1e6 * self.hit_cost_s)

    def _measured_cost(self, pid: int) -> float | None:
        """The lower median of `pid`'s last periods' costs per hit, once there are enough."""
        costs = sorted(self._measured.get(pid, ()))
        return costs[(len(costs) - 1) // 2] if len(costs) >= COST_MIN_PERIODS else None

    def _correction_cost(self, pid: int) -> float:
        """Seconds per hit for the extrapolation's slowdown correction: the measured cost when
        there is one, lower than the configured floor too. The floor keeps the duty cautious;
        the correction must be unbiased. On the H100 a GPT-2 8x512 step's hits cost about 1.4 us
        (every probe attached added 2.5 ms a step for 1,776 hits) against the 2 us floor, which
        by this arithmetic put its extrapolated launch counts about 4% high (H100, 2026-12-07:
        +5.75% median before this change, +0.9% and +4.6% after)."""
        measured = self._measured_cost(pid)
        return self.hit_cost_s if measured is None else max(0.0, measured)

    def hit_cost(self, pid: int) -> float:
        """Seconds per probe hit in process `pid`: the configured cost, or the measured one if higher."""
        return max(self.hit_cost_s, self._measured_cost(pid) or 0.0)

    def hit_costs(self) -> dict[int, float]:
        """Per traced process with a measurement, the cost per hit in use (eacgm.agent.probe.hit_cost)."""
        return {pid: max(self.hit_cost_s, cost) for pid in list(self._measured)
                if (cost := self._measured_cost(pid)) is not None}

    def _extrapolation(self, gains: Mapping[tuple[int, int], int], shares: Mapping[_Unit, float],
                       window: float) -> dict[tuple[int, int], float]:
        """Per (pid, probe) of a cycled unit: calls made in the window / calls counted.

        The probes slow a thread while attached, so its attached-phase rate r_a is below the
        rate it runs at detached. For a thread kept busy by its calls (a launch-bound loop,
        where the guardrail acts) the detached rate is r_a / (1 - c), c being the share of the
        attached phases spent in the cycled probes, estimated from their hit rates (the probes
        attached all along slow both phases alike); a thread mostly waiting
        (GPU-bound) has a small c, and the correction with it. So the window's calls are
        n (share + (1 - share) / (1 - c)) / share for n counted in its attached share."""
        if not shares or window <= 0:
            return {}
        # Never more than twice the duty's own share: a window whose attached time was cut short
        # (the agent stalled) must not multiply its counts without bound.
        floor = {unit: max(share, 0.5 * max(self.duty, self.min_duty), 1e-9) for unit, share in shares.items()}
        busy: dict[int, float] = {}  # pid -> c
        cycled: dict[tuple[int, int], float] = {}  # (pid, probe) -> its unit's attached share
        for (pid, slot), gained in gains.items():
            spec = self._rows.get(slot)
            share = floor.get(self._unit_of(spec), 1.0)  # probes that are not cycled: attached all along
            if share < 1.0:  # only these slow the attached phases against the detached ones
                cycled[(pid, slot)] = share
                busy[pid] = busy.get(pid, 0.0) + max(gained, 0) / (window * share) * _hits(spec) * self._correction_cost(pid)
        return {(pid, slot): (share + (1.0 - share) / (1.0 - min(busy[pid], MAX_SLOWDOWN))) / share
                for (pid, slot), share in cycled.items()}

    def _unit_of(self, spec: ProbeSpec | None) -> _Unit | None:
        return unit_of(spec, self._links.multi_links)

    def _decide(self, per_pid: dict[int, list[tuple[ProbeSpec | None, int, float]]]) -> None:
        worst_fixed = worst_cyclable = 0.0
        self.estimates = {}
        hot: dict[_Unit, set[int]] = {}
        for pid, probes in per_pid.items():
            fixed = cyclable = 0.0
            for spec, slot, rate in probes:
                cost = rate * _hits(spec) * self.hit_cost(pid)
                unit = self._unit_of(spec)
                if unit is not None:
                    cyclable += cost
                    hot.setdefault(unit, set()).add(slot)
                else:
                    fixed += cost
            self.estimates[pid] = fixed + cyclable
            if fixed + cyclable > worst_fixed + worst_cyclable:
                worst_fixed, worst_cyclable = fixed, cyclable
        for unit, slots in hot.items():
            self._slots.setdefault(unit, set()).update(slots)
        total = worst_fixed + worst_cyclable
        # Cycling starts past the budget and ends below AIM of it, so a load near the budget
        # does not switch it on and off every period.
        if not worst_cyclable or total <= (self.budget if self.duty >= 1.0 else AIM * self.budget):
            duty = 1.0
        else:
            duty = min(1.0, max(self.min_duty, (AIM * self.budget - worst_fixed) / worst_cyclable))
            if worst_fixed >= AIM * self.budget and not self._warned_fixed:
                self._warned_fixed = True
                log.warning("guardrail: probes that cannot be cycled alone cost %.1f%% of a traced thread, more than "
                            "the %.1f%% a duty aims at (budget %.1f%%); the cyclable probes cycled at their minimum "
                            "share, turn layers off to go lower", 100 * worst_fixed, 100 * AIM * self.budget,
                            100 * self.budget)
        if duty < 1.0 and self.duty < 1.0:
            if duty < self.duty and worst_fixed + worst_cyclable * self.duty <= self.budget:
                return  # the duty in force still keeps the estimate within the budget
            if self.duty < duty < RELAX * self.duty:
                return  # more tracing, but too little more to be worth a change and a log line
        if duty != self.duty:
            names = self._names(set(hot) | set(self._cycled))
            if duty < 1.0:
                log.warning("guardrail: probes would cost %.1f%% of a traced thread (budget %.1f%%): %s attached "
                            "%.0f%% of each %g s, their statistics extrapolated", 100 * (worst_fixed + worst_cyclable),
                            100 * self.budget, names, 100 * duty, max(self.period_s, MIN_ATTACHED_S / duty))
            else:
                log.info("guardrail: estimated probe cost %.1f%% is within the budget again: %s attached all the time",
                         100 * (worst_fixed + worst_cyclable), names)
            if self.duty >= 1.0:  # the first period starts now, attached
                self._cycle_start = self._last_observe
            self.duty = duty
        for unit in hot:
            self._cycled.setdefault(unit, _Cycled(since=self._last_observe))

    def _names(self, units: set[_Unit]) -> str:
        parts = []
        for unit in sorted(units, key=lambda u: u.entries.value):
            symbols = sorted({self._rows[s].symbol for s in self._slots.get(unit, ())})
            if len(symbols) > 4:
                parts.append(f"{len(symbols)} {unit.entries.value} probes ({', '.join(symbols[:3])}, ...)")
            else:
                parts.append(", ".join(symbols))
        return "; ".join(parts)

    # --- the duty cycle -------------------------------------------------------------------
    @property
    def cycling(self) -> bool:
        """Probes are being duty-cycled: statistics should be read once per period."""
        return self.duty < 1.0

    @property
    def exits_pending(self) -> bool:
        """Entries were detached and their exits follow at the next tick: that tick should come
        soon (exit probes alone still cost hits), yet after the calls in flight have returned."""
        return any(not c.attached and c.exits_attached and unit.exits is not None for unit, c in self._cycled.items())

    def tick(self, now: float) -> bool:
        """Attach or detach the cycled probes as the duty cycle wants; True when a new period
        began (while cycling, the statistics are read then, so that each window holds whole
        periods and its attached share is known to a few milliseconds). A period lasts at least
        ``MIN_ATTACHED_S / duty``, so that each attached phase is long against the agent's loop."""
        period = max(self.period_s, MIN_ATTACHED_S / self.duty)
        boundary = False
        if self.duty >= 1.0:
            want = True
        elif now >= self._cycle_start + period:
            self._cycle_start, want, boundary = now, True, True
        else:
            want = now < self._cycle_start + self.duty * period
        if self._gap_closing:  # a tick after the entries came back, the calls made without them have returned
            self._gap_closing = False
            self._mark_gap(False)
        reattached = False
        for unit, c in self._cycled.items():
            if c.attached == want:
                if not want and c.exits_attached and unit.exits is not None:
                    self._links.detach(unit.exits)  # one tick after the entries
                    c.exits_attached = False
                continue
            # A probe fires once its breakpoint is written and its program set, which attach
            # does last, and stops once the breakpoint is removed, which detach does first
            # (then it waits for the kernel).
            if want:
                if unit.exits is not None and not c.exits_attached:
                    self._links.reattach(unit.exits)
                    c.exits_attached = True
                self._links.reattach(unit.entries)
                c.since = self._clock(time.monotonic())
                reattached = reattached or unit.exits is not None
            else:
                t = time.monotonic()
                if self._at_detach is None:  # the counts the cost measurement splits the period at
                    self._at_detach = (self._clock(t), self._totals(self._read_stats()))
                if unit.exits is not None:
                    self._mark_gap(True)
                detached = self._links.detach(unit.entries)
                c.spans.append((c.since, self._stopped_at(detached, self._clock(t))))
            c.attached = want
        self._gap_closing = self._gap_closing or reattached
        return boundary

    def _stopped_at(self, detached: Detached, asked: float) -> Callable[[], float | None]:
        """When `detached`'s probes stopped firing, in the guardrail's time (None: not yet), no
        earlier than `asked`, when the guardrail detached them."""
        def stopped_at() -> float | None:
            t = detached.stopped_at
            return None if t is None else max(asked, self._clock(t))
        return stopped_at

    def duties(self) -> dict[str, float]:
        """Share of the time each cycled probe is attached (for the eacgm.agent.probe.duty gauge)."""
        return {self._rows[slot].symbol: self.duty for unit in self._cycled for slot in self._slots.get(unit, ())}
