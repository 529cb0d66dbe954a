"""Metric features say how the job runs in the window, never which process it is.

A model learns "normal" from the processes it was fitted on; a feature that carries a
per-process offset (a cumulative total, the number of series a process has, a value the agent
sets per process) makes every fresh process of the same job look anomalous.
"""

from __future__ import annotations

import math

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from eacgm_detector.config import DetectorConfig
from eacgm_detector.features import Vocabulary, window_features
from eacgm_detector.pipeline import Detector
from eacgm_detector.records import MetricPoint
from eacgm_detector.windows import EntityWindows

S = 10**9
ENT = (("host.name", "h"),)
CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
T0 = 1_000_000  # s


def _attrs(dp, **kv) -> None:
    for k, v in kv.items():
        a = dp.attributes.add(key=k)
        if isinstance(v, int):
            a.value.int_value = v
        else:
            a.value.string_value = v


def process_metrics(pid: int, offset: float, started_s: float, dead_functions: int,
                    overhead: float) -> ExportMetricsServiceRequest:
    """20 s of one clean process's agent metrics, exported every second: 100 calls/s of
    ``aten::mm`` lasting 1 ms each, and ``dead_functions`` functions called only while it
    started. ``offset`` is what its counters held before the first export."""
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    _attrs(rm.resource, **{"host.name": "h", "process.pid": 4242})  # the agent's resource
    sm = rm.scope_metrics.add()
    calls = sm.metrics.add(name="eacgm.calls")
    calls.sum.aggregation_temporality, calls.sum.is_monotonic = CUMULATIVE, True
    dur = sm.metrics.add(name="eacgm.call.duration")
    dur.histogram.aggregation_temporality = CUMULATIVE
    est = sm.metrics.add(name="eacgm.agent.overhead.estimate")
    start_ns = int(started_s * S)
    for i in range(21):
        t = (T0 + i) * S
        n = offset + 100 * i
        dp = calls.sum.data_points.add(time_unix_nano=t, start_time_unix_nano=start_ns, as_int=int(n))
        _attrs(dp, **{"code.function.name": "aten::mm", "process.pid": pid})
        for k in range(dead_functions):
            dp = calls.sum.data_points.add(time_unix_nano=t, start_time_unix_nano=start_ns, as_int=1)
            _attrs(dp, **{"code.function.name": f"init{k}", "process.pid": pid})
        hp = dur.histogram.data_points.add(time_unix_nano=t, start_time_unix_nano=start_ns, count=int(n),
                                           sum=0.003 * offset + 0.001 * 100 * i)
        _attrs(hp, **{"code.function.name": "aten::mm", "process.pid": pid})
        gp = est.gauge.data_points.add(time_unix_nano=t, as_double=overhead)
        _attrs(gp, **{"process.pid": pid})
    return req


def features_of(req: ExportMetricsServiceRequest, cfg: DetectorConfig | None = None) -> list[dict[str, float]]:
    """The request through the detector (serve and replay share this path), window by window."""
    cfg = cfg or DetectorConfig(window_s=2.0, context_windows=[])
    det = Detector(cfg)
    det.add_metrics(req)
    return [window_features(w) for ent in det.entities.values() for w in ent.windows.drain()]


def test_two_clean_processes_with_different_offsets_have_the_same_features():
    """Same job, two processes: different pids, cumulative offsets, start times, a different
    number of series that stopped counting, and a different agent overhead estimate."""
    a = features_of(process_metrics(pid=100, offset=0, started_s=T0 - 5, dead_functions=2, overhead=0.02))
    b = features_of(process_metrics(pid=200, offset=987_654, started_s=T0 - 3600, dead_functions=9,
                                    overhead=0.07))
    assert len(a) == len(b) == 11
    for x, y in zip(a, b):
        assert x == pytest.approx(y, rel=1e-9, nan_ok=True)  # the first window's rates: NaN, see windows.py
    steady = a[3]
    assert steady["metric.eacgm.calls.rate"] == 100.0  # every series' rate, summed
    assert math.isclose(steady["metric.eacgm.call.duration.mean"], 0.001)
    assert not any(n.startswith("metric.eacgm.agent.") for w in a for n in w)


def series_features(points: list[tuple[float, float, float]]) -> list[dict[str, float]]:
    """(time s, value, start s) points of one cumulative series through EntityWindows (10 s
    windows), as features per window."""
    vocab = Vocabulary()
    w = EntityWindows(ENT, window_ns=10 * S, grace_ns=0, function_key=vocab.function_key,
                      metric_key=vocab.metric_key)
    for t, v, start in points:
        w.add_point(MetricPoint(ENT, int(t * S), "eacgm.calls", "cumulative", (), v, int(start * S)))
    return [window_features(x) for x in w.drain()]


def test_a_restart_with_its_start_time_counts_only_what_it_counted_since():
    """A series that restarts (a new process re-using it) counts from its new start time:
    10/s before and after a restart at 13.5 s, whose first value (5) is lower than the last
    one; then 1/s, and a restart at 19.5 s into 100/s, whose first value (50) is higher."""
    before = [(t, 10.0 * t, 0.5) for t in range(1, 14)]
    after = [(t, 10.0 * (t - 13.5), 13.5) for t in range(14, 30)]
    assert [x["metric.eacgm.calls.rate"] for x in series_features(before + after)] == [10.0, 10.0, 10.0]
    slow = [(t, 1.0 * t, 0.5) for t in range(1, 20)]
    fast = [(t, 100.0 * (t - 19.5), 19.5) for t in range(20, 30)]
    assert [x["metric.eacgm.calls.rate"] for x in series_features(slow + fast)] == [1.0, 1.0, 100.0]


def test_a_drop_without_a_start_time_restarts_the_baseline():
    """A counter that falls to 7 and counts 10/s from there, start time unknown: the drop is
    not an increase, and neither is what it held when it was first seen again."""
    points = [(t, 10.0 * t, 0.0) for t in range(1, 15)] + [(t, 7 + 10.0 * (t - 15), 0.0) for t in range(15, 30)]
    f = series_features(points)
    assert [x["metric.eacgm.calls.rate"] for x in f] == [10.0, 10.0, 10.0]


def test_excluded_metrics_open_no_windows_and_can_be_kept():
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    _attrs(rm.resource, **{"host.name": "h"})
    m = rm.scope_metrics.add().metrics.add(name="eacgm.agent.probes")
    for i in range(5):
        m.gauge.data_points.add(time_unix_nano=(T0 + i) * S, as_int=458)
    assert features_of(req) == []
    det = Detector(DetectorConfig(window_s=2.0, context_windows=[]))
    det.add_metrics(req)
    [ent] = det.entities.values()
    assert ent.windows.excluded == 5 and det.counters["points.accepted"] == 5
    kept = features_of(req, DetectorConfig(window_s=2.0, context_windows=[], exclude_metrics=[]))
    assert kept[0]["metric.eacgm.agent.probes.mean"] == 458.0


def test_the_series_of_processes_that_went_away_are_forgotten():
    vocab = Vocabulary()
    w = EntityWindows(ENT, window_ns=10 * S, grace_ns=0, function_key=vocab.function_key,
                      metric_key=vocab.metric_key)
    for pid in range(50):  # one short-lived process after another, 20 s apart
        for t in (0, 10):
            at = 1000 + 20 * pid + t
            w.add_point(MetricPoint(ENT, at * S, "eacgm.calls", "cumulative", (("process.pid", str(pid)),), t, 1))
        w.ready()
    assert len(w._last_cumulative) <= 31  # those of the last 600 s, not all 50
