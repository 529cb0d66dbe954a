"""Trace shaping and sampling on hand-made spans (no kernel): the shaper's rules, exactly."""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource

from otel_eacgm.shaping import TraceShaper
from otel_eacgm.spans import CallSpan, SpanIds

MS = 1_000_000
IDS = SpanIds(salt=7)


class Out(CallSpan):
    """A shaped span, read as the tests read it: its trace id, its parent's span id (None: a root)."""

    __slots__ = ()

    @property
    def parent(self) -> int | None:
        return self.parent_span_id or None


def span(call_id: int, parent_id: int, start_ms: float, end_ms: float, *, failed: bool = False) -> CallSpan:
    return Out(f"c{call_id}", IDS.span_id(call_id), IDS.span_id(parent_id) if parent_id else 0, int(start_ms * MS),
               int(end_ms * MS), {}, "failed" if failed else None, Resource({}))


def shaper(**kw: object) -> tuple[TraceShaper, list[Out], SpanIds]:
    out: list[Out] = []
    return TraceShaper(out.append, IDS, **kw), out, IDS  # type: ignore[arg-type]


def add(s: TraceShaper, call_id: int, parent_id: int, start: float, end: float, now: float = 0.0, *,
        sampled: bool = True, **kw: object) -> None:
    s.add(span(call_id, parent_id, start, end, **kw), call_id=call_id, parent_id=parent_id, pid=1, tid=1,  # type: ignore[arg-type]
          now=now, sampled=sampled)


def test_an_outermost_call_and_everything_under_it_is_one_trace() -> None:
    s, out, ids = shaper()
    add(s, 3, 2, 1, 2)   # grandchild completes first
    add(s, 2, 1, 0.5, 3)
    add(s, 4, 1, 3, 4)
    assert out == []     # held until the outermost call completes
    add(s, 1, 0, 0, 5)
    assert [o.name for o in out] == ["c1", "c2", "c3", "c4"]
    assert {o.trace_id for o in out} == {ids.trace_id(1)}
    parents = {o.name: o.parent for o in out}
    assert parents == {"c1": None, "c2": ids.span_id(1), "c3": ids.span_id(2), "c4": ids.span_id(1)}


def test_a_full_parent_splits_its_children_into_their_own_traces() -> None:
    s, out, ids = shaper(max_spans=3)
    add(s, 2, 1, 0, 1)
    add(s, 3, 1, 1, 2)
    add(s, 4, 1, 2, 3)   # would make 4 with the parent: the held children leave as traces
    assert {o.name for o in out} == {"c2", "c3"}
    for o in out:
        assert o.parent is None and o.attributes["eacgm.parent.span_id"] == f"{ids.span_id(1):016x}"
        assert o.trace_id == ids.trace_id(int(o.name[1:]))
    add(s, 1, 0, 0, 4)
    tail = out[2:]
    assert [o.name for o in tail] == ["c1", "c4"] and {o.trace_id for o in tail} == {ids.trace_id(1)}
    assert s.counters.split == 2 and s.counters.held == 0


def test_children_held_too_long_leave_as_their_own_traces() -> None:
    s, out, _ = shaper(max_delay_s=5.0)
    add(s, 2, 1, 0, 1, now=100.0)
    s.tick(104.0)
    assert out == []
    s.tick(105.0)
    assert [o.name for o in out] == ["c2"] and out[0].parent is None


def test_leaf_outermost_calls_share_a_trace_per_slice() -> None:
    s, out, ids = shaper(slice_s=1.0)
    for i, t in enumerate((10.0, 300.0, 999.0, 1000.0, 2500.0)):
        add(s, 10 + i, 0, t, t + 1)
    traces = [o.trace_id for o in out]
    assert traces[0] == traces[1] == traces[2] == ids.slice_trace_id(1, 1, 0)
    assert traces[3] == ids.slice_trace_id(1, 1, 1) != traces[0]
    assert traces[4] == ids.slice_trace_id(1, 1, 2)


def test_unsampled_traces_keep_only_slow_and_failed_spans_with_their_ancestors() -> None:
    s, out, _ = shaper(slow_s=0.010)
    add(s, 3, 2, 1, 2, failed=True, sampled=False)   # failed leaf under c2
    add(s, 2, 1, 0.5, 3, sampled=False)
    add(s, 4, 1, 3, 4, sampled=False)                # fast, fine (sent for its decoder): dropped
    add(s, 5, 1, 4, 20, sampled=False)               # slow: kept
    add(s, 1, 0, 0, 21, sampled=False)
    assert sorted(o.name for o in out) == ["c1", "c2", "c3", "c5"]
    assert s.counters.sampled_out == 1


def test_a_sampled_root_keeps_its_trace_whole_and_an_unsampled_quiet_trace_is_dropped() -> None:
    s, out, _ = shaper()
    add(s, 2, 1, 0, 1, sampled=True)
    add(s, 1, 0, 0, 1)
    assert len(out) == 2
    s, out, _ = shaper(slice_s=0)
    add(s, 1, 0, 0, 1, sampled=False)
    assert out == [] and s.counters.sampled_out == 1


def test_flush_emits_what_is_held() -> None:
    s, out, _ = shaper()
    add(s, 2, 1, 0, 1)
    s.flush()
    assert [o.name for o in out] == ["c2"] and s.counters.held == 0


def test_counters_tell_outermost_calls_from_traces() -> None:
    """The agent's lines name what they count: root_spans (outermost calls exported, each
    split-off subtree too) and traces (distinct trace ids a backend will hold)."""
    s, out, _ = shaper(slice_s=1.0, max_spans=3)
    for i, t in enumerate((10.0, 300.0, 999.0, 1000.0, 2500.0)):  # 5 lone calls over 3 slices
        add(s, 10 + i, 0, t, t + 1)
    add(s, 2, 1, 3000, 3001)  # a call with a child: a trace of its own
    add(s, 1, 0, 3000, 3002)
    for child in (21, 22, 23):  # a full parent: its first two children are split off
        add(s, child, 20, 3100 + child, 3101 + child)
    add(s, 20, 0, 3100, 3200)
    assert len({o.trace_id for o in out}) == 3 + 1 + 3
    assert (s.counters.root_spans, s.counters.traces, s.counters.split) == (5 + 1 + 3, 3 + 1 + 3, 2)
