"""The pipeline's bounds: idle entities evicted, open windows held to their byte budgets, and
the byte estimates those budgets rest on checked against what Python really allocates."""

from __future__ import annotations

import gc
import math
import random
import tracemalloc

import numpy as np
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from eacgm_detector.config import DetectorConfig
from eacgm_detector.pipeline import Detector
from eacgm_detector.records import MetricPoint, SpanRecord, spans_from_request
from eacgm_detector.windows import MAX_VALUES, MetricStats

S = 10**9
T0 = 1_000_000 * S


def _config(**kw) -> DetectorConfig:
    base = {"window_s": 1.0, "grace_s": 0.5, "warmup_windows": 10, "max_entities": 3}
    return DetectorConfig(**(base | kw)).validate()


def _spans(host: str, seconds: list[float], keep: bool = True) -> list[SpanRecord]:
    """One span of `host` at each of `seconds` after T0, as the service decodes them."""
    rng = random.Random(host)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="host.name").value.string_value = host
    ss = rs.scope_spans.add()
    for t in seconds:
        start = T0 + int(t * S)
        sp = ss.spans.add(name=f"fn{rng.randrange(20)}", trace_id=rng.randbytes(16), span_id=rng.randbytes(8),
                          start_time_unix_nano=start, end_time_unix_nano=start + rng.randrange(10**6))
        sp.attributes.add(key="eacgm.layer").value.string_value = "cuda.runtime"
    records, rejected = spans_from_request(req, ("host.name",), keep_spans=keep)
    assert rejected == 0
    return records


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_idle_entities_are_evicted_and_their_open_windows_reported():
    clock = _Clock()
    det = Detector(_config(entity_idle_s=30.0), clock=clock)
    det.feed_spans(_spans("a", [0.1, 1.1, 2.1]))
    assert [(r.start_ns - T0) // S for r in det.ready()] == [0]  # window 1 closed, 2 is open
    det.feed_spans(_spans("a", [2.2]))
    clock.now += 29
    det.feed_spans(_spans("b", [0.1]))
    assert det.ready() == [] and set(det.entities) == {(("host.name", "a"),), (("host.name", "b"),)}
    clock.now += 2  # a: 31 s idle, b: 2 s
    out = det.ready()
    assert [(r.entity, (r.start_ns - T0) // S) for r in out] == [((("host.name", "a"),), 1), ((("host.name", "a"),), 2)]
    assert list(det.entities) == [(("host.name", "b"),)] and det.counters["entities.evicted"] == 1
    # Back again, it starts over: a new entity, warming up again.
    det.feed_spans(_spans("a", [50.0]))
    assert det.entities[(("host.name", "a"),)].fits == 0


def test_a_full_table_takes_a_new_entity_in_place_of_one_idle_for_a_window_and_grace():
    clock = _Clock()
    det = Detector(_config(max_entities=2), clock=clock)
    det.feed_spans(_spans("a", [0.1]))
    clock.now += 1.0
    det.feed_spans(_spans("b", [0.1]))
    clock.now += 0.4  # a idle 1.4 s < window_s + grace_s
    assert det.feed_spans(_spans("c", [0.1, 0.2])) == 2 and det.counters["spans.dropped_entities"] == 2
    clock.now += 0.2  # a idle 1.6 s: its place is taken, its open window reported
    assert det.feed_spans(_spans("c", [0.1])) == 0
    assert set(det.entities) == {(("host.name", "b"),), (("host.name", "c"),)}
    assert [r.entity for r in det.ready()] == [(("host.name", "a"),)]
    # Without a clock (offline replays) nothing is evicted: their result cannot depend on speed.
    det = Detector(_config(max_entities=1, entity_idle_s=1e-3))
    det.feed_spans(_spans("a", [0.1]))
    assert det.feed_spans(_spans("b", [0.1])) == 1 and det.ready() == [] and len(det.entities) == 1


def test_an_entity_over_its_byte_budget_has_its_windows_closed_early():
    det = Detector(_config(max_entity_window_bytes=2_000_000, grace_s=100.0))
    det.feed_spans(_spans("small", [0.5]))
    det.feed_spans(_spans("big", [t / 1000 for t in range(3000)]))  # 3 windows held open by the grace
    held = det.entities[(("host.name", "big"),)].windows.bytes
    assert 0 < held < 2_000_000 and det.ready() == []
    det.feed_spans(_spans("big", [3 + t / 1000 for t in range(5000)]))
    out = det.ready()
    assert sorted((r.start_ns - T0) // S for r in out) == list(range(8))
    assert {r.entity for r in out} == {(("host.name", "big"),)}
    assert det.counters["windows.shed_memory"] == 8 and det.counters["entities.shed_memory"] == 1
    assert det.entities[(("host.name", "big"),)].windows.bytes == 0
    # Its closed windows stay closed: later data for them is late, not a new open window.
    det.feed_spans(_spans("big", [7.5]))
    assert det.counters["spans.late"] == 1
    assert det.entities[(("host.name", "small"),)].windows.bytes > 0  # the others keep theirs


def test_all_entities_over_the_total_budget_shed_the_largest_first():
    det = Detector(_config(max_window_bytes=1_000_000, grace_s=100.0, max_entities=10))
    for host, n in (("a", 3000), ("b", 1000), ("c", 500)):
        det.feed_spans(_spans(host, [t / n for t in range(n)]))
    sizes = {e[0][1]: d.windows.bytes for e, d in det.entities.items()}
    assert sum(sizes.values()) > 1_000_000 > sizes["b"] + sizes["c"]
    assert {r.entity[0][1] for r in det.ready()} == {"a"}
    assert det.window_bytes() == sizes["b"] + sizes["c"]


def _allocated(build) -> tuple[object, int]:
    """What `build()` returns, and the bytes it left allocated."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    out = build()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return out, after - before


def test_the_byte_estimates_cover_what_the_windows_really_hold():
    # Spans kept for re-export (up to max_span_refs), durations of 20 functions. Decoded
    # inside, as the service's records are: what the windows keep of them is what remains.
    def windows_of_spans():
        det = Detector(_config(grace_s=100.0))
        det.feed_spans(_spans("a", [t / 20000 for t in range(20000)]))
        return det

    det, real = _allocated(windows_of_spans)
    estimate = det.window_bytes()
    assert real <= estimate <= 3 * real, (real, estimate)
    # Counter series, each a new one: the state a hostile client can make grow.
    def windows_of_series():
        det = Detector(_config(grace_s=100.0))
        det.feed_points([MetricPoint((("host.name", "a"),), T0 + i * 10**5, "calls", "cumulative",
                                     (("series", f"s{i}"), ("process.pid", "1234")), float(i)) for i in range(20000)])
        return det

    det, real = _allocated(windows_of_series)
    estimate = det.window_bytes()
    assert real <= estimate <= 3 * real, (real, estimate)


def test_gauge_levels_beyond_the_kept_ones_still_count_in_mean_and_max():
    stats = MetricStats("gauge")
    values = np.random.default_rng(0).normal(5.0, 1.0, 3 * MAX_VALUES)
    for v in values:
        stats.add_value(float(v))
    assert len(stats.values) == MAX_VALUES
    assert math.isclose(stats.mean(), float(np.mean(values)), rel_tol=1e-12)
    assert stats.max() == float(np.max(values))
