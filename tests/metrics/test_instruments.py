"""Declarative observable instruments, read back through the OTel SDK's InMemoryMetricReader."""

from __future__ import annotations

from typing import Any

import pytest
from metrics_readback import collect, provider
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics.export import AggregationTemporality, Gauge, Sum

from otel_eacgm.metrics.instruments import Kind, ObservableSpec, register


def _metrics(reader) -> dict[str, Any]:  # noqa: ANN001
    """name -> exported Metric of one collection."""
    data = reader.get_metrics_data()
    return {m.name: m for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics for m in sm.metrics}


class Source:
    """A metrics source whose values and open state the test controls, counting its reads."""

    def __init__(self) -> None:
        self.open = True
        self.reads = 0
        self.values: list[tuple[float, dict[str, Any]]] = []

    def observe(self):  # noqa: ANN201 - a generator, as sources write them
        self.reads += 1
        for value, attributes in self.values:
            yield Observation(value, attributes)


def test_each_kind_becomes_its_otel_instrument_with_unit_and_description() -> None:
    mp, reader = provider()
    register(mp.get_meter("t"), [
        ObservableSpec("t.gauge", Kind.GAUGE, "1", "a ratio", lambda: [Observation(0.5)]),
        ObservableSpec("t.counter", Kind.COUNTER, "By", "bytes so far", lambda: [Observation(10)]),
        ObservableSpec("t.updown", Kind.UP_DOWN_COUNTER, "By", "bytes held", lambda: [Observation(-3)]),
    ], lambda: True)
    metrics = _metrics(reader)
    assert set(metrics) == {"t.gauge", "t.counter", "t.updown"}
    gauge, counter, updown = metrics["t.gauge"], metrics["t.counter"], metrics["t.updown"]
    assert isinstance(gauge.data, Gauge)
    assert (gauge.unit, gauge.description, gauge.data.data_points[0].value) == ("1", "a ratio", 0.5)
    assert isinstance(counter.data, Sum) and counter.data.is_monotonic
    assert counter.data.aggregation_temporality == AggregationTemporality.CUMULATIVE
    assert (counter.unit, counter.description, counter.data.data_points[0].value) == ("By", "bytes so far", 10)
    assert isinstance(updown.data, Sum) and not updown.data.is_monotonic
    assert (updown.unit, updown.description, updown.data.data_points[0].value) == ("By", "bytes held", -3)


def test_every_observation_is_exported_with_its_attributes() -> None:
    mp, reader = provider()
    source = Source()
    source.values = [(1.0, {"hw.id": "a"}), (2.0, {"hw.id": "b", "process.pid": 42})]
    register(mp.get_meter("scope.x"), [ObservableSpec("t.v", Kind.GAUGE, "1", "d", source.observe)], lambda: True)
    points = collect(reader)
    assert {(p.scope, p.value, tuple(sorted(p.attributes.items()))) for p in points} == {
        ("scope.x", 1.0, (("hw.id", "a"),)),
        ("scope.x", 2.0, (("hw.id", "b"), ("process.pid", 42))),
    }


def test_observe_runs_once_per_collection_and_sees_current_values() -> None:
    mp, reader = provider()
    source = Source()
    register(mp.get_meter("t"), [ObservableSpec("t.c", Kind.COUNTER, "1", "d", source.observe)], lambda: True)
    source.values = [(5, {})]
    assert [p.value for p in collect(reader)] == [5]
    source.values = [(8, {})]
    assert [p.value for p in collect(reader)] == [8]
    assert source.reads == 2


def test_a_closed_source_observes_nothing_and_is_not_read() -> None:
    mp, reader = provider()
    source = Source()
    source.values = [(1.0, {})]
    register(mp.get_meter("t"), [
        ObservableSpec("t.a", Kind.GAUGE, "1", "d", source.observe),
        ObservableSpec("t.b", Kind.UP_DOWN_COUNTER, "1", "d", source.observe),
    ], lambda: source.open)
    assert {p.name for p in collect(reader)} == {"t.a", "t.b"}
    assert source.reads == 2
    source.open = False
    assert collect(reader) == []
    assert source.reads == 2  # the guard runs before observe: released handles are never touched


def test_is_open_is_asked_at_every_collection_not_once_at_registration() -> None:
    mp, reader = provider()
    source = Source()
    source.values = [(3.0, {})]
    source.open = False
    register(mp.get_meter("t"), [ObservableSpec("t.g", Kind.GAUGE, "1", "d", source.observe)], lambda: source.open)
    assert collect(reader) == []
    source.open = True
    assert [p.value for p in collect(reader)] == [3.0]


def test_an_exception_in_observe_does_not_stop_the_other_instruments() -> None:
    def broken():  # noqa: ANN202
        raise RuntimeError("handle gone")

    mp, reader = provider()
    register(mp.get_meter("t"), [
        ObservableSpec("t.broken", Kind.GAUGE, "1", "d", broken),
        ObservableSpec("t.fine", Kind.GAUGE, "1", "d", lambda: [Observation(1.0)]),
    ], lambda: True)
    assert [(p.name, p.value) for p in collect(reader)] == [("t.fine", 1.0)]


def test_specs_are_immutable_rows() -> None:
    spec = ObservableSpec("t.g", Kind.GAUGE, "1", "d", lambda: [])
    with pytest.raises(AttributeError):
        spec.unit = "By"  # type: ignore[misc]
