"""Window results to OTLP requests: anomaly log events, score gauges, annotated spans.

Pure functions from results to protobuf messages; ``exporter.py`` sends them. Every name
used here is listed in ``docs/detector.md``.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, SeverityNumber
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from eacgm_detector.online import WindowResult
from eacgm_detector.records import entity_label

EVENT_NAME = "eacgm.anomaly"
ATTR_SCORE = "eacgm.anomaly.score"
ATTR_THRESHOLD = "eacgm.anomaly.threshold"
ATTR_WINDOWS = "eacgm.anomaly.windows"
ATTR_RULE = "eacgm.anomaly.rule"
ATTR_FLAG = "eacgm.anomaly"
ATTR_WINDOW_START = "eacgm.anomaly.window.start"
ATTR_WINDOW_END = "eacgm.anomaly.window.end"
ATTR_FEATURES = "eacgm.anomaly.features"
ATTR_CATEGORIES = "eacgm.anomaly.categories"
ATTR_SHARES = "eacgm.anomaly.feature_shares"
ATTR_TRACE_IDS = "eacgm.anomaly.trace_ids"
ATTR_SPAN_IDS = "eacgm.anomaly.span_ids"
METRIC_SCORE = "eacgm.anomaly.score"
SERVICE_NAME = "otel-eacgm-detector"
SCOPE = InstrumentationScope(name="eacgm_detector")


def _value(v) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, (list, tuple)):
        return AnyValue(array_value=ArrayValue(values=[_value(x) for x in v]))
    return AnyValue(string_value=str(v))


def kv(key: str, v) -> KeyValue:
    """An OTLP attribute."""
    return KeyValue(key=key, value=_value(v))


ATTR_INSTANCE = "service.instance.id"


def _resource(res: WindowResult, instance_id: str | None) -> Resource:
    attrs = [kv("service.name", SERVICE_NAME)] + [kv(k, v) for k, v in res.entity if k != "service.name"]
    if instance_id is not None:
        attrs.append(kv(ATTR_INSTANCE, instance_id))
    return Resource(attributes=attrs)


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="milliseconds")


def anomaly_message(res: WindowResult) -> str:
    """One line a person can act on: where, when, how far, and which features."""
    top = ", ".join(f"{c.name} ({c.category})" for c in res.top) or "n/a"
    run = f" for {res.below} consecutive windows" if res.below > 1 else ""
    return (f"anomaly on {entity_label(res.entity)} in window {_iso(res.start_ns)}..{_iso(res.end_ns)}: "
            f"log-likelihood {res.score:.1f} < threshold {res.threshold:.1f}{run} (rule {res.rule}); "
            f"top features: {top}")


def anomaly_log(res: WindowResult) -> LogRecord:
    """The ``eacgm.anomaly`` event of an anomalous window."""
    rec = LogRecord(
        time_unix_nano=res.end_ns, observed_time_unix_nano=time.time_ns(),
        severity_number=SeverityNumber.SEVERITY_NUMBER_WARN, severity_text="WARN",
        event_name=EVENT_NAME, body=AnyValue(string_value=anomaly_message(res)),
        attributes=[kv(ATTR_SCORE, res.score), kv(ATTR_THRESHOLD, res.threshold),
                    kv(ATTR_WINDOWS, res.below), kv(ATTR_RULE, res.rule), kv(ATTR_WINDOW_START, res.start_ns), kv(ATTR_WINDOW_END, res.end_ns),
                    kv(ATTR_FEATURES, [c.name for c in res.top]),
                    kv(ATTR_CATEGORIES, [c.category for c in res.top]),
                    kv(ATTR_SHARES, [float(c.share) for c in res.top])]
        + [kv(k, v) for k, v in res.entity])
    if res.affected:
        rec.trace_id, rec.span_id = res.affected[0]
        rec.attributes.extend([kv(ATTR_TRACE_IDS, [t.hex() for t, _ in res.affected]),
                               kv(ATTR_SPAN_IDS, [s.hex() for _, s in res.affected])])
    return rec


def logs_request(results: list[WindowResult], instance_id: str | None = None) -> ExportLogsServiceRequest | None:
    """Anomaly events of ``results``, one ResourceLogs per anomalous window; None if none.
    ``instance_id`` (the replica's name) goes on their resource."""
    req = ExportLogsServiceRequest()
    for res in results:
        if res.anomalous:
            rl = req.resource_logs.add(resource=_resource(res, instance_id))
            rl.scope_logs.add(scope=SCOPE).log_records.append(anomaly_log(res))
    return req if req.resource_logs else None


def score_request(results: list[WindowResult],
                  instance_id: str | None = None) -> ExportMetricsServiceRequest | None:
    """Gauge ``eacgm.anomaly.score`` per scored window, at the window's end; None if none.
    ``instance_id`` (the replica's name) goes on their resource."""
    req = ExportMetricsServiceRequest()
    for res in results:
        if res.score is None:
            continue
        rm = req.resource_metrics.add(resource=_resource(res, instance_id))
        m = rm.scope_metrics.add(scope=SCOPE).metrics.add(
            name=METRIC_SCORE, unit="1",
            description="Log-likelihood of the entity's latest window (lower is more anomalous)")
        m.gauge.data_points.add(time_unix_nano=res.end_ns, start_time_unix_nano=res.start_ns,
                                as_double=res.score)
    return req if req.resource_metrics else None


def spans_request(results: list[WindowResult]) -> ExportTraceServiceRequest | None:
    """The received spans of ``results``, with ``eacgm.anomaly`` / ``eacgm.anomaly.score``
    added to spans of scored windows (warm-up windows pass through unannotated)."""
    req = ExportTraceServiceRequest()
    groups: dict[tuple[bytes, str], object] = {}
    scopes: dict[tuple[bytes, str, bytes, str], object] = {}
    for res in results:
        extra = [] if res.score is None else [kv(ATTR_FLAG, res.anomalous), kv(ATTR_SCORE, res.score)]
        for resource, rs_url, scope, ss_url, span in res.span_refs:  # serialized (records.SpanRecord)
            rs = groups.get((resource, rs_url))
            if rs is None:
                rs = groups[(resource, rs_url)] = req.resource_spans.add(schema_url=rs_url)
                rs.resource.MergeFromString(resource)
            ss = scopes.get((resource, rs_url, scope, ss_url))
            if ss is None:
                ss = scopes[(resource, rs_url, scope, ss_url)] = rs.scope_spans.add(schema_url=ss_url)
                ss.scope.MergeFromString(scope)
            out = ss.spans.add()
            out.MergeFromString(span)
            out.attributes.extend(extra)
    return req if req.resource_spans else None
