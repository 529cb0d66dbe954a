"""Read metrics back through the OTel SDK's InMemoryMetricReader, flattened for asserts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader


@dataclass(frozen=True)
class Point:
    """One exported data point."""

    scope: str
    name: str
    unit: str
    attributes: dict[str, Any]
    value: float


def provider() -> tuple[MeterProvider, InMemoryMetricReader]:
    """A MeterProvider whose metrics the returned reader collects on demand."""
    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader]), reader


def collect(reader: InMemoryMetricReader) -> list[Point]:
    """Every data point of one collection."""
    points = []
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for dp in metric.data.data_points:
                    points.append(Point(sm.scope.name, metric.name, metric.unit, dict(dp.attributes), dp.value))
    return points


def select(points: list[Point], name: str, **attributes: Any) -> list[Point]:
    """Points of ``name`` whose attributes include ``attributes`` (dots spelled as __)."""
    wanted = {k.replace("__", "."): v for k, v in attributes.items()}
    return [p for p in points if p.name == name and all(p.attributes.get(k) == v for k, v in wanted.items())]


def one(points: list[Point], name: str, **attributes: Any) -> Point:
    """The single point matching; fails with what was there otherwise."""
    found = select(points, name, **attributes)
    assert len(found) == 1, f"{name} {attributes}: {len(found)} points; have {[(p.name, p.attributes) for p in points if p.name == name]}"
    return found[0]
