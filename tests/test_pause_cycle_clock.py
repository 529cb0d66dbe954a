"""The pause cycle's clock for the guardrail: monotonic time less the paused blocks before it
(the eBPF test tests/ebpf/test_pause_cycle.py runs the switches on real probes)."""

from __future__ import annotations

import pytest

from otel_eacgm.pause_cycle import PauseCycle


class Links:
    """pause()/resume() as ProbeLinks answers them, with the clock moved as each takes its time."""

    def pause(self) -> int:
        return 3

    def resume(self) -> int:
        return 3


def test_traced_time_leaves_out_every_paused_block(monkeypatch: pytest.MonkeyPatch) -> None:
    ns = iter([10, 10, 20, 20, 30, 30])  # (start, end) of each switch, in seconds here
    monkeypatch.setattr("otel_eacgm.pause_cycle.time.monotonic_ns", lambda: next(ns) * 10**9)
    cycle = PauseCycle(Links(), 10.0, None, now=0.0)  # type: ignore[arg-type]
    cycle.tick(10.0)   # paused 10..20
    assert cycle.paused and cycle.traced_time(15.0) == 10.0
    cycle.tick(20.0)   # traced 20..30
    assert not cycle.paused
    assert [cycle.traced_time(t) for t in (5.0, 15.0, 25.0)] == [5.0, 10.0, 15.0]
    cycle.tick(30.0)   # paused again from 30
    assert [cycle.traced_time(t) for t in (25.0, 30.0, 40.0)] == [15.0, 20.0, 20.0]
