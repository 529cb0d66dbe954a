"""OTLP protobuf messages to the detector's flat records.

The service, the offline ``fit`` path and the tests all go through here, so a span or a
metric point is interpreted one way only. Items that cannot be placed in time (no
timestamp, end before start, after the year 2200) are counted as rejected, as OTLP partial
success expects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality
from opentelemetry.proto.trace.v1.trace_pb2 import Status

#: An entity: the (key, value) pairs of the configured resource attributes it has.
Entity = tuple[tuple[str, str], ...]

#: Timestamps after 2200-01-01 are refused: no real telemetry has them, and near 2**63 the
#: window bounds would overflow the int64 attributes anomalies are reported with.
MAX_TIME_NS = 7_258_118_400 * 10**9

LAYER_ATTR = "eacgm.layer"
FUNCTION_ATTR = "code.function.name"
NCCL_BYTES_ATTR = "nccl.bytes"


def any_value(v: AnyValue):
    """The Python value of an OTLP ``AnyValue`` (scalars only; others become their text)."""
    kind = v.WhichOneof("value")
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(v, kind)
    return None if kind is None else str(getattr(v, kind)).strip()


def attributes(kvs: Iterable[KeyValue]) -> dict:
    """OTLP attribute list as a dict."""
    return {kv.key: any_value(kv.value) for kv in kvs}


def entity_of(resource_attrs: dict, keys: tuple[str, ...]) -> Entity:
    """The entity a resource belongs to: the configured keys it carries, in config order.

    A resource with none of them falls back to ``service.name`` so its data is still
    windowed separately from other services' instead of being mixed into one entity.
    """
    ent = tuple((k, str(resource_attrs[k])) for k in keys if k in resource_attrs)
    if ent:
        return ent
    return (("service.name", str(resource_attrs.get("service.name", "unknown"))),)


def entity_label(entity: Entity) -> str:
    """Stable text form, used for routing hashes and log messages."""
    return ",".join(f"{k}={v}" for k, v in entity)


@dataclass(slots=True)
class SpanRecord:
    """One span as the features see it; ``ref`` is what re-exporting it takes: (resource,
    resource schema URL, scope, scope schema URL, span), the messages serialized, so that a
    kept span holds its own bytes and not the whole request it came in."""

    entity: Entity
    time_ns: int
    duration_s: float
    layer: str
    function: str
    error: bool
    nccl_bytes: float | None
    trace_id: bytes
    span_id: bytes
    ref: tuple | None = field(default=None, repr=False)


@dataclass(slots=True)
class MetricPoint:
    """One metric data point reduced to a value.

    ``kind`` is ``gauge`` (a level: mean/max features), ``cumulative`` or ``delta`` (a
    counter: rate features). Histograms contribute two counters, ``<name>.count`` and
    ``<name>.sum``, whose increases in a window give the window's own mean (a cumulative
    histogram's sum/count is the mean since the process started, which says little about
    this window and differs from one process to the next). ``start_ns`` is a cumulative
    point's start time (0 when unknown): a new one means the counter restarted, whatever
    its value, so the windows can tell a restart from an increase.
    """

    entity: Entity
    time_ns: int
    name: str
    kind: str
    series: tuple
    value: float
    start_ns: int = 0


def spans_from_request(
    req: ExportTraceServiceRequest, keys: tuple[str, ...], *, keep_spans: bool = True
) -> tuple[list[SpanRecord], int]:
    """Decode spans; return the records and how many spans were rejected. ``keep_spans=False``
    leaves ``ref`` None (nothing will re-export them)."""
    out: list[SpanRecord] = []
    rejected = 0
    for rs in req.resource_spans:
        entity = entity_of(attributes(rs.resource.attributes), keys)
        resource = rs.resource.SerializeToString() if keep_spans else None
        for ss in rs.scope_spans:
            scope = ss.scope.SerializeToString() if keep_spans else None
            for span in ss.spans:
                if (span.start_time_unix_nano == 0 or span.end_time_unix_nano < span.start_time_unix_nano
                        or span.end_time_unix_nano > MAX_TIME_NS
                        or len(span.trace_id) != 16 or len(span.span_id) != 8):
                    rejected += 1
                    continue
                attrs = attributes(span.attributes)
                nb = attrs.get(NCCL_BYTES_ATTR)
                out.append(SpanRecord(
                    entity=entity,
                    time_ns=span.start_time_unix_nano,
                    duration_s=(span.end_time_unix_nano - span.start_time_unix_nano) / 1e9,
                    layer=str(attrs.get(LAYER_ATTR, "unknown")),
                    function=str(attrs.get(FUNCTION_ATTR) or span.name or "unknown"),
                    error=span.status.code == Status.STATUS_CODE_ERROR,
                    nccl_bytes=_byte_count(nb),
                    trace_id=span.trace_id,
                    span_id=span.span_id,
                    ref=((resource, rs.schema_url, scope, ss.schema_url, span.SerializeToString())
                         if keep_spans else None),
                ))
    return out, rejected


def _byte_count(value) -> float | None:
    """``nccl.bytes`` as a float, or None unless it is a finite, non-negative number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


def _number(dp) -> float:
    return float(dp.as_double if dp.WhichOneof("value") == "as_double" else dp.as_int)


def _series(dp) -> tuple:
    return tuple(sorted((kv.key, str(any_value(kv.value))) for kv in dp.attributes))


def _points(entity: Entity, metric) -> Iterator[MetricPoint]:
    data = metric.WhichOneof("data")
    if data == "gauge":
        for dp in metric.gauge.data_points:
            yield MetricPoint(entity, dp.time_unix_nano, metric.name, "gauge", _series(dp), _number(dp))
    elif data == "sum":
        cum = metric.sum.aggregation_temporality == AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
        # A non-monotonic sum is an up-down level (memory in use), not a rate.
        kind = "gauge" if not metric.sum.is_monotonic else ("cumulative" if cum else "delta")
        for dp in metric.sum.data_points:
            yield MetricPoint(entity, dp.time_unix_nano, metric.name, kind, _series(dp), _number(dp),
                              dp.start_time_unix_nano)
    elif data in ("histogram", "exponential_histogram", "summary"):
        body = getattr(metric, data)
        cum = getattr(body, "aggregation_temporality", 2) == AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
        for dp in body.data_points:
            series = _series(dp)
            kind = "cumulative" if cum else "delta"
            start = dp.start_time_unix_nano
            yield MetricPoint(entity, dp.time_unix_nano, metric.name + ".count", kind, series, float(dp.count), start)
            if math.isfinite(dp.sum):
                yield MetricPoint(entity, dp.time_unix_nano, metric.name + ".sum", kind, series, float(dp.sum), start)


def points_from_request(
    req: ExportMetricsServiceRequest, keys: tuple[str, ...]
) -> tuple[list[MetricPoint], int]:
    """Decode metric data points; return the records and how many points were rejected."""
    out: list[MetricPoint] = []
    rejected = 0
    for rm in req.resource_metrics:
        entity = entity_of(attributes(rm.resource.attributes), keys)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in _points(entity, metric):
                    if not 0 < p.time_ns <= MAX_TIME_NS or not math.isfinite(p.value) or not metric.name:
                        rejected += 1
                    else:
                        out.append(p)
    return out, rejected


def points_from_logs(req, keys: tuple[str, ...]) -> tuple[list[MetricPoint], int]:
    """Log records as counter increments ``log.records`` split by severity, so a burst of
    errors in the logs shows as a rate feature without parsing log text."""
    out: list[MetricPoint] = []
    rejected = 0
    for rl in req.resource_logs:
        entity = entity_of(attributes(rl.resource.attributes), keys)
        for sl in rl.scope_logs:
            for rec in sl.log_records:
                t = rec.time_unix_nano or rec.observed_time_unix_nano
                if not 0 < t <= MAX_TIME_NS:
                    rejected += 1
                    continue
                sev = rec.severity_text or f"N{rec.severity_number}"
                out.append(MetricPoint(entity, t, "log.records", "delta",
                                       (("direction", sev.upper()),), 1.0))
    return out, rejected
