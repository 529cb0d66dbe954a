"""Regression tests for what the endpoint fuzz found: values that decoded fine and then broke
windowing, features or emission for every entity of the batch."""

from __future__ import annotations

import math

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

from eacgm_detector import emit
from eacgm_detector.config import DetectorConfig
from eacgm_detector.emit import kv
from eacgm_detector.features import window_features
from eacgm_detector.pipeline import Detector
from eacgm_detector.records import MAX_TIME_NS, spans_from_request

T0 = 1_760_000_000 * 10**9
KEYS = ("host.name",)


def _spans(times: list[int], nccl_bytes=None) -> ExportTraceServiceRequest:  # noqa: ANN001
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(kv("host.name", "n0"))
    ss = rs.scope_spans.add()
    for i, t in enumerate(times):
        sp = ss.spans.add(name="ncclAllReduce", trace_id=bytes(15) + b"\1", span_id=i.to_bytes(8, "big"),
                          start_time_unix_nano=t, end_time_unix_nano=min(t + 1000, 2**64 - 1))
        sp.attributes.extend([kv("eacgm.layer", "nccl"), kv("code.function.name", "ncclAllReduce")])
        if nccl_bytes is not None:
            sp.attributes.append(kv("nccl.bytes", nccl_bytes))
    return req


def test_timestamps_beyond_2200_are_rejected_not_windowed() -> None:
    records, rejected = spans_from_request(_spans([T0, 2**63, 2**64 - 1, MAX_TIME_NS + 1]), KEYS)
    assert (len(records), rejected) == (1, 3)


def test_far_future_span_cannot_break_emission() -> None:
    """Window bounds of an accepted span always fit the int64 attributes of an anomaly event."""
    cfg = DetectorConfig(window_s=86400, warmup_windows=10)
    det = Detector(cfg)
    det.add_traces(_spans([MAX_TIME_NS - 10**6]))
    results = det.drain()
    assert results and all(r.end_ns < 2**63 for r in results)
    for r in results:
        r.score, r.threshold, r.anomalous = -1.0, 0.0, True
    assert emit.logs_request(results) is not None and emit.score_request(results) is not None


def test_negative_or_infinite_nccl_bytes_are_ignored() -> None:
    for bad in (-1.0, -1e308, math.inf, math.nan, "12"):
        det = Detector(DetectorConfig(window_s=1, warmup_windows=10))
        det.add_traces(_spans([T0, T0 + 10], nccl_bytes=bad))
        (win,) = det.entities[(("host.name", "n0"),)].windows.drain()
        feats = window_features(win)
        assert "span.nccl.ncclAllReduce.log_bandwidth" not in feats
        assert all(math.isfinite(v) for v in feats.values()), (bad, feats)


def test_one_metric_name_as_gauge_delta_and_cumulative_in_one_window() -> None:
    """Mixed kinds under one name (or in the shared `other` bucket) were a ZeroDivisionError."""
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.append(kv("host.name", "n0"))
    sm = rm.scope_metrics.add()
    cum = sm.metrics.add(name="x")
    cum.sum.is_monotonic = True
    cum.sum.aggregation_temporality = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    cum.sum.data_points.add(time_unix_nano=T0 + 1, as_int=5)
    delta = sm.metrics.add(name="x")
    delta.sum.is_monotonic = True
    delta.sum.aggregation_temporality = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
    delta.sum.data_points.add(time_unix_nano=T0 + 2, as_int=3)
    sm.metrics.add(name="x").gauge.data_points.add(time_unix_nano=T0 + 3, as_double=0.5)
    det = Detector(DetectorConfig(window_s=1, warmup_windows=10))
    assert det.add_metrics(req) == 0
    (win,) = det.entities[(("host.name", "n0"),)].windows.drain()
    feats = window_features(win)
    assert feats["metric.x.delta.rate"] == 3.0 and feats["metric.x.gauge.mean"] == 0.5
    assert all(math.isfinite(v) for v in feats.values()), feats
