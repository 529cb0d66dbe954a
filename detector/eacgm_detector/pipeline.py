"""Routes decoded OTLP records to per-entity detectors and collects window results.

This is the whole detector minus the network: the gRPC service feeds it, the offline
``fit`` path replays recorded OTLP through it, and the scale-out test runs several of them
side by side.
"""

from __future__ import annotations

import logging
from collections import Counter

from eacgm_detector.config import DetectorConfig
from eacgm_detector.online import EntityDetector, WindowResult
from eacgm_detector.persist import SavedModel
from eacgm_detector.records import (Entity, entity_label, points_from_logs, points_from_request,
                                    spans_from_request)

log = logging.getLogger(__name__)


class Detector:
    """All entities of one detector process.

    ``counters`` holds what was accepted, rejected, late or dropped, so nothing is lost
    silently and nothing needs a log line per item.
    """

    def __init__(self, cfg: DetectorConfig, model: SavedModel | None = None) -> None:
        self.cfg = cfg
        self.model = model
        self.keys = tuple(cfg.entity_attributes)
        self.entities: dict[Entity, EntityDetector] = {}
        self.counters: Counter[str] = Counter()

    def _entity(self, entity: Entity) -> EntityDetector | None:
        det = self.entities.get(entity)
        if det is None:
            if len(self.entities) >= self.cfg.max_entities:
                return None
            det = self.entities[entity] = EntityDetector(entity, self.cfg, self.model)
            log.info("new entity %s", entity_label(entity))
        return det

    def feed_spans(self, records) -> int:
        """Window decoded spans; return how many were dropped for the entity cap."""
        return self._feed(records, "add_span", "spans")

    def feed_points(self, records, kind: str = "points") -> int:
        """Window decoded metric points (or log counts, ``kind="logs"``)."""
        return self._feed(records, "add_point", kind)

    def _feed(self, records, add: str, kind: str) -> int:
        dropped = 0
        for rec in records:
            det = self._entity(rec.entity)
            if det is None:
                dropped += 1
            elif not getattr(det.windows, add)(rec):
                self.counters[f"{kind}.late"] += 1
        if dropped:
            self.counters[f"{kind}.dropped_entities"] += dropped
            log.warning("dropped %d %s: max_entities=%d reached", dropped, kind, self.cfg.max_entities)
        self.counters[f"{kind}.accepted"] += len(records) - dropped
        return dropped

    def add_traces(self, req) -> int:
        """Ingest an ExportTraceServiceRequest; return the number of rejected spans."""
        recs, bad = spans_from_request(req, self.keys)
        self.counters["spans.rejected"] += bad
        return bad + self._feed(recs, "add_span", "spans")

    def add_metrics(self, req) -> int:
        """Ingest an ExportMetricsServiceRequest; return the number of rejected points."""
        recs, bad = points_from_request(req, self.keys)
        self.counters["points.rejected"] += bad
        return bad + self._feed(recs, "add_point", "points")

    def add_logs(self, req) -> int:
        """Ingest an ExportLogsServiceRequest; return the number of rejected records."""
        recs, bad = points_from_logs(req, self.keys)
        self.counters["logs.rejected"] += bad
        return bad + self._feed(recs, "add_point", "logs")

    def ready(self) -> list[WindowResult]:
        """Score every window whose watermark has passed."""
        return self._score(lambda d: d.windows.ready())

    def drain(self) -> list[WindowResult]:
        """Close and score every open window (shutdown, end of a replay)."""
        return self._score(lambda d: d.windows.drain())

    def _score(self, pick) -> list[WindowResult]:
        out = []
        for ent in sorted(self.entities):
            det = self.entities[ent]
            for win in pick(det):
                res = det.score(win)
                self.counters["windows.scored" if res.score is not None else "windows.warmup"] += 1
                self.counters["windows.anomalous"] += res.anomalous
                out.append(res)
        return out
