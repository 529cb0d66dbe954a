"""Replicas routed by entity find exactly the anomalies a single detector finds."""

from __future__ import annotations

import zlib

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from eacgm_detector.config import DetectorConfig
from eacgm_detector.pipeline import Detector
from eacgm_detector.records import attributes, entity_label, entity_of
from recording import SEC, T0, recording

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
