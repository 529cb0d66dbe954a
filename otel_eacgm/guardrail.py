"""Overhead guardrail: keep what the probes cost a traced process within a budget.

Every probe hit traps the traced thread into the kernel (about 0.7 us on the H200 host, several
on VMs), so a launch-bound loop pays for each kernel launch. The agent knows each probe's hit
rate from the kernel's call statistics, and estimates a process' cost as the sum of its hits
per second times ``probe_hit_cost_us``, a share of one thread's time (an upper bound for a
process whose calls are spread over several threads). When that estimate exceeds
``overhead_budget``, the entry-only probes (kernel launches: the calls that dominate
launch-bound steps) are duty-cycled: attached for a share d of every ``guardrail_period_s``
and detached for the rest, with d chosen to bring the estimate to the budget. A detached uprobe
costs nothing; the BPF program that stays loaded costs nothing either.

Only entry-only probes are cycled: detaching a probe that has a return probe could leave a
call entered before the detach without its return, and the thread's call stack off by one.
When the other probes alone exceed the budget, the guardrail says so once and cycles the
launches at their minimum share; turning layers off is then the user's choice.

While a probe is cycled its statistics are extrapolated: what it counted in a stats window is
divided by the share of the window it was attached (the gauge ``eacgm.agent.probe.duty``
names the probes concerned). For a steady loop this is unbiased; a workload whose rate changes
within a period is estimated from the attached parts only.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence

from otel_eacgm.bpf_loader import CallProgram, CallStat, releases_running
from otel_eacgm.probes.catalog import ProbeSpec

log = logging.getLogger(__name__)

MIN_ATTACHED_S = 1.0


@dataclasses.dataclass
class _Cycled:
    """A throttled probe's attach history, to know its attached share of any window."""

    attached: bool = True
    since: float = 0.0
    spans: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # closed attached intervals

    def share(self, t0: float, t1: float) -> float:
        if t1 <= t0:
            return 1.0
        on = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in self.spans)
        if self.attached:
            on += max(0.0, t1 - max(self.since, t0))
        return on / (t1 - t0)

    def forget_before(self, t: float) -> None:
        self.spans = [(a, b) for a, b in self.spans if b > t]


class Guardrail:
    """Estimates each process' probe cost and duty-cycles the launch probes past the budget."""

    def __init__(self, program: CallProgram, rows: Mapping[int, ProbeSpec], *, budget: float, hit_cost_s: float,
                 period_s: float, min_duty: float, now: float) -> None:
        self._program = program
        self._rows = rows
        self.budget = budget
        self.hit_cost_s = hit_cost_s
        self.period_s = period_s
        self.min_duty = min_duty
        self.duty = 1.0
        self._cycle_start = now
        self._last_observe = now
        self._last_counts: dict[tuple[int, int], int] = {}
        self._cycled: dict[int, _Cycled] = {}
        self.estimates: dict[int, float] = {}    # pid -> estimated cost share with every probe attached
        self._warned_fixed = False
        self._warned_release = False

    # --- measurement ----------------------------------------------------------------------
    def observe(self, entries: Sequence[CallStat], now: float) -> dict[int, float]:
        """Take one read of the kernel's statistics: update the estimates and the duty, and
        return per probe the factor that extrapolates this window's counts (1 / attached share)."""
        t0, self._last_observe = self._last_observe, now
        window = now - t0
        # Never more than twice the duty's own factor: a window whose attached time was cut short
        # (the agent stalled) must not multiply its counts without bound.
        bound = 2.0 / max(self.duty, self.min_duty)
        shares = {slot: c.share(t0, now) for slot, c in self._cycled.items()}
        scale = {slot: min(bound, 1.0 / max(share, 1e-9)) for slot, share in shares.items() if share < 0.999}
        per_pid: dict[int, list[tuple[ProbeSpec | None, int, float]]] = {}
        counts: dict[tuple[int, int], int] = {}
        for e in entries:
            counts[(e.pid, e.probe_id)] = counts.get((e.pid, e.probe_id), 0) + e.count
        blind = any(share * window < 0.05 for share in shares.values())
        for (pid, slot), n in counts.items():
            gained = n - self._last_counts.get((pid, slot), 0)
            if gained > 0 and window > 0:
                rate = gained * scale.get(slot, 1.0) / window
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

    def _decide(self, per_pid: dict[int, list[tuple[ProbeSpec | None, int, float]]]) -> None:
        worst_fixed = worst_cyclable = 0.0
        self.estimates = {}
        hot: set[int] = set()
        for pid, probes in per_pid.items():
            fixed = cyclable = 0.0
            for spec, slot, rate in probes:
                hits = 1 if spec is not None and not spec.has_return and not spec.exit_probes else 2
                cost = rate * hits * self.hit_cost_s
                if spec is not None and hits == 1:
                    cyclable += cost
                    hot.add(slot)
                else:
                    fixed += cost
            self.estimates[pid] = fixed + cyclable
            if fixed + cyclable > worst_fixed + worst_cyclable:
                worst_fixed, worst_cyclable = fixed, cyclable
        if worst_fixed + worst_cyclable <= self.budget or not worst_cyclable:
            duty = 1.0
        else:
            duty = min(1.0, max(self.min_duty, (self.budget - worst_fixed) / worst_cyclable))
            if worst_fixed >= self.budget and not self._warned_fixed:
                self._warned_fixed = True
                log.warning("guardrail: probes other than launches alone cost %.1f%% of a traced thread (budget "
                            "%.1f%%); launches cycled at their minimum share, turn layers off to go lower",
                            100 * worst_fixed, 100 * self.budget)
        if duty < 1.0 and self.duty < 1.0 and abs(duty - self.duty) < 0.2 * self.duty:
            return  # hysteresis: small changes of a throttled duty are not worth a log line
        if duty >= 1.0 and self.duty < 1.0 and worst_fixed + worst_cyclable > 0.8 * self.budget:
            return  # only back to full tracing with some margin
        if duty != self.duty:
            names = ", ".join(sorted({self._rows[s].symbol for s in hot | set(self._cycled)}))
            if duty < 1.0:
                log.warning("guardrail: probes would cost %.1f%% of a traced thread (budget %.1f%%): %s attached "
                            "%.0f%% of each %g s, their statistics extrapolated", 100 * (worst_fixed + worst_cyclable),
                            100 * self.budget, names, 100 * duty, max(self.period_s, MIN_ATTACHED_S / duty))
            else:
                log.info("guardrail: estimated probe cost %.1f%% is within the budget again: %s attached all the time",
                         100 * (worst_fixed + worst_cyclable), names)
            self.duty = duty
        for slot in hot:
            self._cycled.setdefault(slot, _Cycled(since=self._last_observe))

    # --- the duty cycle -------------------------------------------------------------------
    @property
    def cycling(self) -> bool:
        """Probes are being duty-cycled: statistics should be read once per period."""
        return self.duty < 1.0

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
        for slot, c in self._cycled.items():
            if c.attached == want:
                continue
            symbol = self._rows[slot].symbol
            # A probe fires once its breakpoint is written and its program set, which attach
            # does last, and stops once the breakpoint is removed, which detach does first
            # (then it waits for the kernel).
            if want:
                self._program.reattach_entries(slot, symbol)
                c.since = time.monotonic()
            else:
                c.spans.append((c.since, time.monotonic()))
                self._program.detach_entries(slot, symbol)
            c.attached = want
        return boundary

    def duties(self) -> dict[str, float]:
        """Share of the time each cycled probe is attached (for the eacgm.agent.probe.duty gauge)."""
        return {self._rows[slot].symbol: self.duty for slot in self._cycled}
