"""Event-time windows, grace period, bounded feature names, missing-value policy."""

from __future__ import annotations

import math

from eacgm_detector.features import (OTHER, Vocabulary, feature_category, fill_value, vectorize,
                                     window_features)
from eacgm_detector.records import MetricPoint, SpanRecord
from eacgm_detector.windows import EntityWindows

S = 10**9
ENT = (("host.name", "h"),)


def span(t_s: float, dur_s: float = 0.01, fn: str = "cudaMalloc", layer: str = "cuda.runtime",
         error: bool = False, nbytes=None) -> SpanRecord:
    return SpanRecord(ENT, int(t_s * S), dur_s, layer, fn, error, nbytes, b"t" * 16, b"s" * 8)


def windows(grace_s: float = 2.0, vocab: Vocabulary | None = None) -> EntityWindows:
    vocab = vocab or Vocabulary()
    return EntityWindows(ENT, window_ns=10 * S, grace_ns=int(grace_s * S),
                         function_key=vocab.function_key, metric_key=vocab.metric_key)


def test_windows_follow_event_time_and_grace():
    w = windows()
    assert w.add_span(span(1000.5)) and w.add_span(span(1009.9))
    assert w.add_span(span(1011.0))
    assert w.ready() == []  # watermark 1009 < end 1010
    assert w.add_span(span(1008.0))  # late but within grace: accepted
    w.add_span(span(1012.5))  # watermark 1010.5 passes the first window's end
    [first] = w.ready()
    assert (first.start_ns, first.end_ns) == (1000 * S, 1010 * S)
    assert first.functions[("cuda.runtime", "cudaMalloc")].count == 3
    assert not w.add_span(span(1005.0)) and w.late == 1  # its window is closed
    assert [x.start_ns for x in w.drain()] == [1010 * S]


def test_replaying_the_same_records_gives_the_same_features():
    def run():
        w = windows()
        for i in range(300):
            w.add_span(span(1000 + i * 0.1, dur_s=0.001 * (1 + i % 7)))
        return [window_features(x) for x in w.drain()]
    assert run() == run()


def test_span_features_and_nccl_bandwidth():
    w = windows()
    w.add_span(span(1, 0.5, "ncclAllReduce", "nccl", nbytes=1e9))
    w.add_span(span(2, 1.5, "ncclAllReduce", "nccl", error=True, nbytes=1e9))
    f = window_features(w.drain()[0])
    base = "span.nccl.ncclAllReduce"
    assert f[f"{base}.count"] == 2 and f[f"{base}.error_rate"] == 0.5
    assert math.isclose(f[f"{base}.log_bandwidth"], math.log1p(2e9 / 2.0))
    assert math.isclose(f[f"{base}.log_duration.mean"], (math.log(0.5) + math.log(1.5)) / 2)
    assert feature_category(f"{base}.log_bandwidth") == "communication"


def test_metric_features_gauge_and_cumulative_rate():
    w = windows()
    series = (("network.io.direction", "receive"),)
    for t, v in [(1, 100.0), (5, 300.0), (9, 1300.0)]:
        w.add_point(MetricPoint(ENT, t * S, "system.network.io", "cumulative", series, v))
    for t, v in [(2, 0.5), (4, 0.9)]:
        w.add_point(MetricPoint(ENT, t * S, "hw.gpu.utilization", "gauge", (), v))
    f = window_features(w.drain()[0])
    assert f["metric.system.network.io.receive.rate"] == 150.0  # 1200 By over 8 s
    assert f["metric.hw.gpu.utilization.mean"] == 0.7 and f["metric.hw.gpu.utilization.max"] == 0.9
    assert feature_category("metric.hw.gpu.utilization.mean") == "gpu"
    assert feature_category("metric.system.network.io.receive.rate") == "network"


def test_a_cumulative_histogram_gives_the_mean_of_what_the_window_added():
    """The lifetime mean (sum/count of a cumulative point) is not this window's: 100 calls of
    1 ms before the window, then 10 calls of 5 ms in it, is a window mean of 5 ms."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest  # noqa: PLC0415
    from opentelemetry.proto.metrics.v1 import metrics_pb2  # noqa: PLC0415

    from eacgm_detector.records import points_from_request  # noqa: PLC0415

    req = ExportMetricsServiceRequest()
    m = req.resource_metrics.add().scope_metrics.add().metrics.add(name="eacgm.call.duration")
    m.histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    for t, count, total in [(1, 100, 0.100), (5, 105, 0.125), (9, 110, 0.150)]:
        m.histogram.data_points.add(time_unix_nano=t * S, count=count, sum=total)
    w = windows()
    points, rejected = points_from_request(req, ("host.name",))
    assert rejected == 0
    for p in points:
        w.add_point(MetricPoint(ENT, p.time_ns, p.name, p.kind, p.series, p.value))
    f = window_features(w.drain()[0])
    assert math.isclose(f["metric.eacgm.call.duration.mean"], 0.005)
    assert math.isclose(f["metric.eacgm.call.duration.count.rate"], 1.25)  # 10 calls over 8 s


def test_a_series_that_began_in_a_window_gives_its_rate_only_if_it_covers_most_of_it():
    """A fresh process exported every second into 10 s windows: its series' first point (at
    8 s) is a baseline, and one increment (8..9 s) is too short a look at a bursty count; the
    next window, covered whole, has the rate. A series that began at 1 s covers 8 s of its
    first window, enough."""
    late, early = windows(), windows()
    for t in range(8, 25):
        late.add_point(MetricPoint(ENT, t * S, "eacgm.calls", "cumulative", (), 50.0 + 10.0 * t))
    for t in range(1, 12):
        early.add_point(MetricPoint(ENT, t * S, "eacgm.calls", "cumulative", (), 10.0 * t))
    first, second = (window_features(x) for x in late.drain()[:2])
    assert math.isnan(first["metric.eacgm.calls.rate"]) and second["metric.eacgm.calls.rate"] == 10.0
    assert window_features(early.drain()[0])["metric.eacgm.calls.rate"] == 10.0


def test_function_names_are_bounded_with_an_other_bucket():
    vocab = Vocabulary(max_functions=3)
    w = windows(vocab=vocab)
    for i in range(10):
        w.add_span(span(1, fn=f"k{i}"))
    keys = set(w.drain()[0].functions)
    assert keys == {("cuda.runtime", "k0"), ("cuda.runtime", "k1"), ("cuda.runtime", "k2"),
                    ("cuda.runtime", OTHER)}


def test_missing_counts_are_zero_other_missing_features_are_nan():
    assert fill_value("span.torch.aten::mm.count") == 0.0
    assert math.isnan(fill_value("span.torch.aten::mm.log_duration.mean"))
    X = vectorize([{"a.count": 3.0}], ["a.count", "b.count", "b.log_duration.mean"])
    assert X[0, 0] == 3.0 and X[0, 1] == 0.0 and math.isnan(X[0, 2])


def test_open_windows_are_bounded():
    w = windows(grace_s=1e6)  # a huge grace would otherwise keep every window open
    w.max_open = 4
    for i in range(20):
        w.add_span(span(100 + 10 * i))
        w.ready()
    assert len(w._open) <= 5
