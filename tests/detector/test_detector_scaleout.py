"""Replicas routed by entity find exactly the anomalies a single detector finds.

The routing of the Collector's ``loadbalancing`` exporter is played here, in one process:
requests are split by the entity's resource attributes, as ``routing_key: attributes`` does, and
sent over real gRPC to real detector replicas whose output goes to a real OTLP receiver.
tests/scaleout/ runs the real exporter in a gateway Collector in front of replica processes.
"""

from __future__ import annotations

import zlib

import grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from eacgm_detector.config import DetectorConfig
from eacgm_detector.exporter import OtlpExporter
from eacgm_detector.pipeline import Detector
from eacgm_detector.records import attributes, entity_label, entity_of
from eacgm_detector.service import DetectorService
from eacgm_testkit.recording import SEC, T0, recording, send

RANKS = [0, 1, 2, 3, 4, 5]
ANOMALIES = {110: "latency", 120: "gpu", 130: "bandwidth"}


def run(detectors: list[Detector], reqs) -> set:
    keys = tuple(detectors[0].cfg.entity_attributes)
    results = []
    for req in reqs:
        rs = req.resource_spans if isinstance(req, ExportTraceServiceRequest) else req.resource_metrics
        # The loadbalancing exporter's job: route every request of an entity to one replica.
        ent = entity_of(attributes(rs[0].resource.attributes), keys)
        det = detectors[zlib.crc32(entity_label(ent).encode()) % len(detectors)]
        (det.add_traces if isinstance(req, ExportTraceServiceRequest) else det.add_metrics)(req)
        results += det.ready()
    for det in detectors:
        results += det.drain()
    return {(r.entity, r.start_ns, round(r.score, 9), tuple(c.name for c in r.top))
            for r in results if r.anomalous}


def test_sharded_replicas_equal_one_detector():
    cfg = DetectorConfig(window_s=1.0, grace_s=0.5, warmup_windows=90, refit_every=30,
                         max_components=4)
    reqs = recording(RANKS, 150, ANOMALIES)
    single = run([Detector(cfg)], reqs)
    shards = [Detector(cfg) for _ in range(3)]
    sharded = run(shards, reqs)
    assert all(d.entities for d in shards), "every replica got some entities"
    assert len({e for e, *_ in single}) == len(RANKS)
    assert sharded == single
    # Not vacuous: every injected window of every rank is flagged, and models were refitted.
    for ent in {e for e, *_ in single}:
        assert {T0 + w * SEC for w in ANOMALIES} <= {s for e, s, *_ in single if e == ent}
    assert all(ent.fits >= 2 for d in shards for ent in d.entities.values())


def merged(reqs) -> list:
    """What a collector's batch processor hands its exporter: requests of all ranks merged,
    one traces and one metrics request per window."""
    out = []
    for i in range(0, len(reqs), 2 * len(RANKS)):
        tr, mt = ExportTraceServiceRequest(), ExportMetricsServiceRequest()
        for req in reqs[i:i + 2 * len(RANKS)]:
            if isinstance(req, ExportTraceServiceRequest):
                tr.resource_spans.extend(req.resource_spans)
            else:
                mt.resource_metrics.extend(req.resource_metrics)
        out += [tr, mt]
    return out


def split_by_backend(req, n: int, keys: tuple[str, ...]) -> dict[int, object]:
    """The loadbalancing exporter's job: split a request by routing key (the entity's resource
    attributes) into one request per backend."""
    parts: dict[int, object] = {}
    groups = req.resource_spans if isinstance(req, ExportTraceServiceRequest) else req.resource_metrics
    for rs in groups:
        ent = entity_of(attributes(rs.resource.attributes), keys)
        i = zlib.crc32(entity_label(ent).encode()) % n
        part = parts.setdefault(i, type(req)())
        (part.resource_spans if isinstance(req, ExportTraceServiceRequest) else part.resource_metrics).append(rs)
    return parts


def anomalies_out(rec) -> tuple[set, set]:
    """(anomaly events, score gauge points) a replica set sent to its receiver."""
    events = set()
    for req in rec.logs:
        for rl in req.resource_logs:
            for lr in rl.scope_logs[0].log_records:
                a = attributes(lr.attributes)
                events.add((a["host.name"], a["process.pid"], a["eacgm.anomaly.window.start"],
                            round(a["eacgm.anomaly.score"], 9), lr.body.string_value))
    points = {(attributes(rm.resource.attributes)["process.pid"], dp.time_unix_nano, round(dp.as_double, 9))
              for req in rec.metrics for rm in req.resource_metrics
              for m in rm.scope_metrics[0].metrics for dp in m.gauge.data_points}
    return events, points


def test_replicas_over_grpc_equal_one_detector(receivers):
    cfg = DetectorConfig(listen="127.0.0.1:0", window_s=1.0, grace_s=0.5, warmup_windows=90,
                         refit_every=30, max_components=4, reexport_spans=False)
    keys = tuple(cfg.entity_attributes)
    batches = merged(recording(RANKS, 150, ANOMALIES))
    outputs = []
    for n in (1, 3):
        rec, endpoint = receivers()
        replicas = [DetectorService(cfg, exporter=OtlpExporter(endpoint)).start() for _ in range(n)]
        channels = [grpc.insecure_channel(f"127.0.0.1:{svc.port}") for svc in replicas]
        for req in batches:
            for i, part in split_by_backend(req, n, keys).items():
                send(channels[i], part)
        for ch, svc in zip(channels, replicas):
            ch.close()
            svc.stop()
        assert all(svc.detector.entities for svc in replicas), "every replica got some entities"
        assert not any(svc.exporter.counters["dropped"] or svc.exporter.counters["logs.failed"]
                       for svc in replicas)
        outputs.append(anomalies_out(rec))
    (one_events, one_points), (three_events, three_points) = outputs
    assert three_events == one_events and three_points == one_points
    assert len(one_points) == len(RANKS) * (150 - 90)
    flagged = {(host, pid, start) for host, pid, start, *_ in one_events}
    for rank in RANKS:
        pid = str(1000 + rank)
        assert {T0 + w * SEC for w in ANOMALIES} <= {s for _, p, s in flagged if p == pid}
