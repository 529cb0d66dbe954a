"""The guardrail's arithmetic on hand-made statistics (the eBPF test runs it on real probes)."""

from __future__ import annotations

import logging

import pytest

from otel_eacgm.bpf_program import CallStat
from otel_eacgm.probe_links import Detached, GroupKind
from otel_eacgm.events import BW_BUCKETS, DUR_BUCKETS
from otel_eacgm.guardrail import AIM, MIN_ATTACHED_S, RELAX, Guardrail
from otel_eacgm.probes.catalog import CATALOG, TORCH_SLOTS, torch_spec

ROWS = dict(enumerate(CATALOG))
ROWS[TORCH_SLOTS[0]] = torch_spec("add_", "Tensor")
SLOT = {spec.symbol: slot for slot, spec in ROWS.items()}


class FakeProgram:
    """Records the guardrail's detach/attach calls instead of touching the kernel."""

    def __init__(self, multi_links: bool = True) -> None:
        self.multi_links = multi_links
        self.calls: list[tuple[str, GroupKind]] = []
        self.stats: list[CallStat] = []  # what call_stats() reads (at a detach)
        self.scales: list[dict] = []  # what the guardrail's observe() returned, in order

    def call_stats(self) -> list[CallStat]:
        return self.stats

    def detach(self, kind: GroupKind) -> Detached:
        self.calls.append(("detach", kind))
        return Detached(1, 0, stopped=float("-inf"))  # took effect when the guardrail asked

    def reattach(self, kind: GroupKind) -> int:
        self.calls.append(("attach", kind))
        return 1


@pytest.fixture(autouse=True)
def no_release_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """An earlier test's agent may still be releasing its probes on this machine: not these tests' business."""
    monkeypatch.setattr("otel_eacgm.guardrail.releases_running", lambda: False)


def stat(symbol: str, count: int, pid: int = 7) -> CallStat:
    return CallStat(pid, SLOT[symbol], 0, 0, count, 0, 0, 0, 0, 0, (0,) * DUR_BUCKETS, (0,) * BW_BUCKETS)


def guardrail(budget: float = 0.05, multi_links: bool = True) -> tuple[Guardrail, FakeProgram]:
    program = FakeProgram(multi_links)
    return Guardrail(program, ROWS, read_stats=program.call_stats, budget=budget, hit_cost_s=1e-6, period_s=10.0, min_duty=0.05, now=0.0), program  # type: ignore[arg-type]


def test_within_budget_nothing_is_cycled() -> None:
    g, program = guardrail()
    g.observe([stat("cuLaunchKernel", 40_000)], 1.0)  # 40k hits/s x 1 us = 4% < 5%
    assert g.duty == 1.0 and g.estimates == {7: pytest.approx(0.04)}
    assert g.tick(2.0) is False and program.calls == []


def test_over_budget_launches_get_the_duty_that_meets_it() -> None:
    g, program = guardrail()
    # launches 100k/s (10%) plus a synchronise with a return probe, 2 hits x 5k/s (1%, not cycled)
    g.observe([stat("cuLaunchKernel", 100_000), stat("cuStreamSynchronize", 5_000)], 1.0)
    assert g.duty == pytest.approx((AIM * 0.05 - 0.01) / 0.10)
    period = max(10.0, MIN_ATTACHED_S / g.duty)
    g.tick(1.0 + 0.5 * period)  # past the attached share of the first period: detached
    assert program.calls == [("detach", GroupKind.LAUNCH)]
    assert g.tick(1.0 + period + 0.01) is True  # a new period: attached again, statistics due
    assert program.calls[-1] == ("attach", GroupKind.LAUNCH)
    assert g.duties() == {"cuLaunchKernel": pytest.approx((AIM * 0.05 - 0.01) / 0.10)}


def test_counts_of_a_cycled_probe_are_scaled_by_its_attached_share(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([7.0, 12.0])  # detach at 7 s, re-attach at 12 s (time.monotonic inside tick)
    monkeypatch.setattr("otel_eacgm.guardrail.time.monotonic", lambda: next(clock))
    g, _ = guardrail()
    g.observe([stat("cuLaunchKernel", 100_000)], 1.0)     # starts cycling (duty 0.4, period 10 s from now)
    assert g.tick(7.0) is False    # past half of the first 10 s period: detached
    assert g.tick(12.0) is True    # the next period: attached again
    scale = g.observe([stat("cuLaunchKernel", 110_000)], 12.0)
    # attached 1..7 s of the 11 s window; the probes took 0.2% of those 6 s, a negligible slowdown
    assert scale[(7, SLOT["cuLaunchKernel"])] == pytest.approx(11 / 6, rel=1e-2)


def test_an_attached_phase_ends_when_the_detach_took_effect_not_when_it_was_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The link closer begins a close behind earlier closes and their kernel synchronisations:
    the probes fire until then, and those calls were counted as made in the attached phase."""
    clock = iter([7.0, 12.0])
    monkeypatch.setattr("otel_eacgm.guardrail.time.monotonic", lambda: next(clock))
    g, program = guardrail()
    late = Detached(1, 1)
    program.detach = lambda kind: late  # type: ignore[method-assign]
    g.observe([stat("cuLaunchKernel", 100_000)], 1.0)
    g.tick(7.0)                    # asked to detach at 7 s
    late.closing(8.0)              # the close began at 8 s: attached 1..8 s
    g.tick(12.0)
    scale = g.observe([stat("cuLaunchKernel", 110_000)], 12.0)
    assert scale[(7, SLOT["cuLaunchKernel"])] == pytest.approx(11 / 7, rel=1e-2)


def test_a_detach_not_yet_in_effect_counts_as_attached(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([7.0, 12.0])
    monkeypatch.setattr("otel_eacgm.guardrail.time.monotonic", lambda: next(clock))
    g, program = guardrail()
    pending = Detached(1, 1)
    program.detach = lambda kind: pending  # type: ignore[method-assign]
    g.observe([stat("cuLaunchKernel", 100_000)], 1.0)
    g.tick(7.0)
    g.tick(12.0)
    scale = g.observe([stat("cuLaunchKernel", 110_000)], 12.0)
    assert (7, SLOT["cuLaunchKernel"]) not in scale  # still firing: attached the whole window


def test_a_thread_slowed_by_its_probes_is_extrapolated_at_its_detached_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([7.0, 12.0])
    monkeypatch.setattr("otel_eacgm.guardrail.time.monotonic", lambda: next(clock))
    g, _ = guardrail()
    g.observe([stat("cuLaunchKernel", 100_000)], 1.0)
    g.tick(7.0)
    g.tick(12.0)
    # 400k launches/s while attached (1..7 s): 40% of the thread's time in probes, so detached
    # (7..12 s) it ran at 400k / 0.6 a second
    scale = g.observe([stat("cuLaunchKernel", 100_000 + 6 * 400_000)], 12.0)
    made = 6 * 400_000 + 5 * 400_000 / 0.6
    assert scale[(7, SLOT["cuLaunchKernel"])] == pytest.approx(made / (6 * 400_000))


def test_probes_attached_all_along_do_not_count_in_the_slowdown_correction(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([7.0, 12.0])
    monkeypatch.setattr("otel_eacgm.guardrail.time.monotonic", lambda: next(clock))
    g, _ = guardrail()
    g.observe([stat("cuLaunchKernel", 100_000), stat("cuStreamSynchronize", 1_000)], 1.0)
    g.tick(7.0)
    g.tick(12.0)
    # as above, plus 100k synchronisations/s in both phases (2 hits each: 20% of the thread's
    # time): they slow the attached and the detached phases alike, so the launches' detached
    # rate is still 400k / 0.6 a second (H200, 2026-12-04: counting them overestimated by 20%)
    scale = g.observe([stat("cuLaunchKernel", 100_000 + 6 * 400_000),
                       stat("cuStreamSynchronize", 1_000 + 11 * 100_000)], 12.0)
    made = 6 * 400_000 + 5 * 400_000 / 0.6
    assert scale[(7, SLOT["cuLaunchKernel"])] == pytest.approx(made / (6 * 400_000))


def test_a_duty_whose_estimate_crosses_the_budget_is_lowered_at_once() -> None:
    g, _ = guardrail()
    g.observe([stat("cuLaunchKernel", 100_000)], 1.0)  # 10%: duty 0.4, estimated to cost 4%
    first = g.duty
    # 11.5% with every probe attached: at the duty in force 4.6%, within the budget, kept
    g.observe([stat("cuLaunchKernel", 215_000)], 2.0)
    assert g.duty == first
    # 13.5%: at the duty in force 5.4%, past the budget: lowered to AIM of it (a duty that met
    # the budget exactly was kept through a 20% rise before: a 5% budget reached 1.056x once)
    g.observe([stat("cuLaunchKernel", 350_000)], 3.0)
    assert g.duty == pytest.approx(AIM * 0.05 / 0.135)


def test_a_throttled_duty_is_raised_only_by_a_worthwhile_step() -> None:
    g, _ = guardrail()
    g.observe([stat("cuLaunchKernel", 100_000)], 1.0)  # duty 0.4
    first = g.duty
    g.observe([stat("cuLaunchKernel", 190_000)], 2.0)  # 9%: duty 0.44 would do, too small a step
    assert g.duty == first
    g.observe([stat("cuLaunchKernel", 250_000)], 3.0)  # 6%: duty 0.67
    assert g.duty == pytest.approx(AIM * 0.05 / 0.06) and g.duty > RELAX * first
    g.observe([stat("cuLaunchKernel", 295_000)], 4.0)  # 4.5%: below the budget, yet above its AIM
    assert g.duty < 1.0
    g.observe([stat("cuLaunchKernel", 330_000)], 5.0)  # 3.5%: full tracing again
    assert g.duty == 1.0


def test_operators_are_cycled_entries_first_and_exits_a_tick_later() -> None:
    g, program = guardrail()
    # add_ 50k/s x 2 hits (10%) and launches 50k/s (5%): both cyclable, duty 0.04 / 0.15
    g.observe([stat("add_", 50_000), stat("cuLaunchKernel", 50_000)], 1.0)
    assert g.duty == pytest.approx(AIM * 0.05 / 0.15)
    period = max(10.0, MIN_ATTACHED_S / g.duty)
    g.tick(1.0 + 0.6 * period)
    assert sorted(program.calls) == [("detach", GroupKind.LAUNCH), ("detach", GroupKind.TORCH)]
    assert g.exits_pending  # the agent ticks again soon
    g.tick(1.0 + 0.61 * period)  # the next tick: the operators' exits follow
    assert program.calls[-1] == ("detach", GroupKind.TORCH_EXIT) and len(program.calls) == 3
    assert not g.exits_pending
    g.tick(1.0 + 0.62 * period)
    assert len(program.calls) == 3
    g.tick(1.0 + period + 0.01)  # attached again: exits before entries
    again = program.calls[3:]
    assert again.index(("attach", GroupKind.TORCH_EXIT)) < again.index(("attach", GroupKind.TORCH))
    assert set(g.duties()) == {"add_", "cuLaunchKernel"}


def test_enqueue_calls_are_cycled_entries_first_and_returns_a_tick_later() -> None:
    g, program = guardrail()
    # memsets 60k/s x 2 hits (12%, return probes) and synchronisations 1k/s x 2 hits (0.2%)
    g.observe([stat("cudaMemsetAsync", 60_000), stat("cuStreamSynchronize", 1_000)], 1.0)
    assert g.duty == pytest.approx((AIM * 0.05 - 0.002) / 0.12)
    period = max(10.0, MIN_ATTACHED_S / g.duty)
    g.tick(1.0 + 0.6 * period)
    assert program.calls == [("detach", GroupKind.ENQUEUE)]
    g.tick(1.0 + 0.61 * period)
    assert program.calls[-1] == ("detach", GroupKind.ENQUEUE_RETURN)
    g.tick(1.0 + period + 0.01)
    again = program.calls[2:]
    assert again.index(("attach", GroupKind.ENQUEUE_RETURN)) < again.index(("attach", GroupKind.ENQUEUE))
    assert set(g.duties()) == {"cudaMemsetAsync"}  # the synchronisations stay attached


def test_enqueue_calls_are_not_cycled_without_multi_links() -> None:
    g, program = guardrail(multi_links=False)
    g.observe([stat("cudaMemsetAsync", 60_000), stat("cuLaunchKernel", 50_000)], 1.0)
    assert g.duty == 0.05 and set(g.duties()) == {"cuLaunchKernel"}


def test_operators_are_not_cycled_without_multi_links() -> None:
    g, _ = guardrail(multi_links=False)
    # the same load: only the launches can be cycled, and the operators are a fixed 10%
    g.observe([stat("add_", 50_000), stat("cuLaunchKernel", 50_000)], 1.0)
    assert g.duty == 0.05
    assert set(g.duties()) == {"cuLaunchKernel"}


def test_probes_that_cannot_be_cycled_over_budget_are_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    g, _ = guardrail(budget=0.01)
    with caplog.at_level(logging.WARNING):
        g.observe([stat("cuStreamSynchronize", 10_000), stat("cuLaunchKernel", 10_000)], 1.0)
        g.observe([stat("cuStreamSynchronize", 20_000), stat("cuLaunchKernel", 20_000)], 2.0)
    assert g.duty == 0.05
    assert sum("turn layers off" in r.message for r in caplog.records) == 1


def test_no_probe_is_cycled_while_an_earlier_agent_releases_its_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("otel_eacgm.guardrail.releases_running", lambda: True)
    g, program = guardrail()
    g.observe([stat("cuLaunchKernel", 100_000)], 1.0)
    assert g.duty == 1.0 and program.calls == []
    monkeypatch.setattr("otel_eacgm.guardrail.releases_running", lambda: False)
    g.observe([stat("cuLaunchKernel", 200_000)], 2.0)
    assert g.duty == pytest.approx(AIM * 0.05 / 0.10)


def test_a_releasing_child_is_recognised_by_its_name(tmp_path) -> None:  # noqa: ANN001
    from otel_eacgm.probe_links import RELEASER_NAME, releases_running  # noqa: PLC0415

    (tmp_path / "41").mkdir()
    (tmp_path / "41" / "comm").write_text("python3\n")
    assert not releases_running(tmp_path)
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "comm").write_text(RELEASER_NAME + "\n")
    assert releases_running(tmp_path)


def _cycled_periods(monkeypatch: pytest.MonkeyPatch, *sync_attached_per_s: int) -> tuple[Guardrail, FakeProgram]:
    """Launches at 100k/s (10% at the configured 1 us) start the cycling at 1 s (duty 0.38 of a
    10 s period); then one period per rate given: detached 5 s after it began, attached again
    5 s later, statistics read then. While attached, launches ran at 100k/s and the uncycled
    synchronisations at that period's `sync_attached_per_s`; detached, the synchronisations ran
    at 1000/s."""
    clock = iter([t for i in range(len(sync_attached_per_s)) for t in (6.0 + 10 * i, 11.0 + 10 * i)])
    monkeypatch.setattr("otel_eacgm.guardrail.time.monotonic", lambda: next(clock))
    g, program = guardrail()
    launches, syncs = 100_000, 1_000
    g.observe([stat("cuLaunchKernel", launches), stat("cuStreamSynchronize", syncs)], 1.0)
    assert g.duty == pytest.approx((AIM * 0.05 - 0.002) / 0.10)
    for i, rate in enumerate(sync_attached_per_s):
        launches, syncs = launches + 5 * 100_000, syncs + 5 * rate
        program.stats = [stat("cuLaunchKernel", launches), stat("cuStreamSynchronize", syncs)]
        g.tick(6.0 + 10 * i)
        assert g.tick(11.0 + 10 * i) is True
        syncs += 5 * 1_000
        program.scales.append(g.observe([stat("cuLaunchKernel", launches), stat("cuStreamSynchronize", syncs)],
                                        11.0 + 10 * i))
    return g, program


def test_a_process_slowed_by_its_probes_more_than_the_configured_cost_says_gets_the_measured_cost(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        g, _ = _cycled_periods(monkeypatch, 800, 800)
    # 20% slower while 500k launch hits landed in 5 s: 0.2 x 5 s / 500k = 2 us a hit, not 1
    assert g.hit_cost(7) == pytest.approx(2e-6)
    assert g.hit_costs() == {7: pytest.approx(2e-6)}
    assert any("about 2.0 us" in r.message for r in caplog.records)
    # the estimate with every probe attached: launches 100k/s x 2 us, synchronisations 2 x 1000/s x 2 us
    assert g.estimates[7] > 0.2 and g.duty < 0.38


def test_a_process_its_probes_do_not_slow_keeps_the_configured_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    g, _ = _cycled_periods(monkeypatch, 1_000, 1_000)
    assert g.hit_cost(7) == 1e-6
    assert g.hit_costs() == {7: 1e-6}  # measured (0 slowdown), the configured cost in use


def test_the_slowdown_correction_uses_the_measured_cost_even_below_the_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not slowed by its probes (measured 0 us a hit, floor 1 us): the counts of an attached
    phase are the rate of the whole window, extrapolated by the attached share alone. With the
    floor, 100k launch hits/s would have read as 10% slower while attached."""
    g, program = _cycled_periods(monkeypatch, 1_000, 1_000, 1_000)
    assert g.hit_cost(7) == 1e-6  # the duty stays cautious
    share = 5 / 10  # attached 5 s of each 10 s period
    assert program.scales[-1][(7, SLOT["cuLaunchKernel"])] == pytest.approx(1 / share)
    assert program.scales[0][(7, SLOT["cuLaunchKernel"])] > 1.05 / share  # one period: the floor still


def test_one_period_measures_nothing_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    g, _ = _cycled_periods(monkeypatch, 800)
    assert g.hit_cost(7) == 1e-6 and g.hit_costs() == {}


def test_a_slowdown_of_the_workload_s_own_in_one_attached_phase_is_no_hit_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A straggling step in one attached phase (80% slower: 8 us a hit if the probes had done
    it), none in the next two: the median of the periods keeps the configured cost. A running
    mean started from the first period took 91 us a hit from a straggler on the H100."""
    g, _ = _cycled_periods(monkeypatch, 200, 1_000, 1_000)
    assert g.hit_cost(7) == 1e-6
    g, _ = _cycled_periods(monkeypatch, 200, 1_000)  # two periods: the lower of the two
    assert g.hit_cost(7) == 1e-6
