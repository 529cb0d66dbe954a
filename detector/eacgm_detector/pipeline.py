"""Routes decoded OTLP records to per-entity detectors and collects window results.

This is the whole detector minus the network: the gRPC service feeds it, the offline
``fit`` path replays recorded OTLP through it, and the scale-out test runs several of them
side by side.

Bounds: at most ``max_entities`` entities; given a clock (``serve`` gives it one), an entity
idle for ``entity_idle_s`` is evicted, and a new entity takes the place of the least recently
seen one once that one has been idle for a window and its grace period. The open windows of
one entity and of all together are held to ``max_entity_window_bytes`` and
``max_window_bytes`` (estimates, see ``windows``) by closing them early. Evicted and early
windows are scored and reported like the others.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable

from eacgm_detector.config import DetectorConfig
from eacgm_detector.online import EntityDetector, WindowResult
from eacgm_detector.persist import SavedModel
from eacgm_detector.records import (Entity, entity_label, points_from_logs, points_from_request,
                                    spans_from_request)

log = logging.getLogger(__name__)

#: Seconds of a log line budget (_LogLimit).
LOG_INTERVAL_S = 60.0
#: Seconds between two sweeps for idle entities.
SWEEP_INTERVAL_S = 1.0


class _LogLimit:
    """At most ``lines`` log lines of one kind per LOG_INTERVAL_S; the next one says how many
    were held back (what they were about is in the detector's counters)."""

    def __init__(self, level: int, lines: int = 1) -> None:
        self.level = level
        self.lines = lines
        self._start = -math.inf
        self._logged = 0
        self._held = 0

    def __call__(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._start >= LOG_INTERVAL_S:
            self._start, self._logged = now, 0
        if self._logged >= self.lines:
            self._held += 1
            return
        suffix = f" ({self._held} more such lines held back)" if self._held else ""
        self._logged, self._held = self._logged + 1, 0
        log.log(self.level, message + suffix, *args)


class Detector:
    """All entities of one detector process.

    ``counters`` holds what was accepted, rejected, late or dropped, so nothing is lost
    silently and nothing needs a log line per item.

    Parameters
    ----------
    cfg : DetectorConfig
    model : SavedModel, optional
        A fixed model for every entity instead of warm-up.
    clock : callable, optional
        Seconds (monotonic) for idle eviction; ``serve`` passes ``time.monotonic``. None (the
        offline replays) never evicts, so a replay's result does not depend on its speed.
    """

    def __init__(self, cfg: DetectorConfig, model: SavedModel | None = None, *,
                 clock: Callable[[], float] | None = None) -> None:
        self.cfg = cfg
        self.model = model
        self.clock = clock
        self.keys = tuple(cfg.entity_attributes)
        self.entities: dict[Entity, EntityDetector] = {}
        self.counters: Counter[str] = Counter()
        self._now = 0.0
        self._swept = -math.inf
        self._no_room_at: float | None = None  # _now of the last search for an idle entity that found none
        self._released: list[WindowResult] = []  # windows of evicted entities, out at the next ready()
        self._warn_full = _LogLimit(logging.WARNING)
        self._warn_memory = _LogLimit(logging.WARNING)
        # Processes come and go, a flood of made-up entities must not flood the log.
        self._log_new = _LogLimit(logging.INFO, lines=100)

    def _entity(self, entity: Entity) -> EntityDetector | None:
        det = self.entities.get(entity)
        if det is None:
            if len(self.entities) >= self.cfg.max_entities and not self._make_room():
                return None
            det = self.entities[entity] = EntityDetector(entity, self.cfg, self.model)
            self._log_new("new entity %s", entity_label(entity))
        det.last_seen = self._now
        return det

    def _make_room(self) -> bool:
        """Evict the least recently seen entity if it has been idle for a window and its grace
        period (so one that is sending keeps its place); whether one was."""
        if self.clock is None or self._no_room_at == self._now:  # searched already for this batch
            return False
        oldest = min(self.entities.values(), key=lambda d: d.last_seen)
        if self._now - oldest.last_seen < self.cfg.window_s + self.cfg.grace_s:
            self._no_room_at = self._now
            return False
        self._evict(oldest.windows.entity)
        return True

    def _evict(self, entity: Entity) -> None:
        det = self.entities.pop(entity)
        self._released.extend(self._scored(det, det.windows.drain()))
        self.counters["entities.evicted"] += 1

    def _sweep(self) -> None:
        """Evict the entities idle for entity_idle_s, at most once per SWEEP_INTERVAL_S."""
        if self.clock is None or self._now - self._swept < SWEEP_INTERVAL_S:
            return
        self._swept = self._now
        for ent in [e for e, d in self.entities.items() if self._now - d.last_seen >= self.cfg.entity_idle_s]:
            self._evict(ent)

    def feed_spans(self, records) -> int:
        """Window decoded spans; return how many were dropped for the entity cap."""
        return self._feed(records, "add_span", "spans")

    def feed_points(self, records, kind: str = "points") -> int:
        """Window decoded metric points (or log counts, ``kind="logs"``)."""
        return self._feed(records, "add_point", kind)

    def _feed(self, records, add: str, kind: str) -> int:
        if self.clock is not None:
            self._now = self.clock()
        dropped = 0
        for rec in records:
            det = self._entity(rec.entity)
            if det is None:
                dropped += 1
            elif not getattr(det.windows, add)(rec):
                self.counters[f"{kind}.late"] += 1
        if dropped:
            self.counters[f"{kind}.dropped_entities"] += dropped
            self._warn_full("dropped %d %s of new entities: max_entities=%d reached and none idle for "
                            "window_s + grace_s (%g s); counted in %s.dropped_entities", dropped, kind,
                            self.cfg.max_entities, self.cfg.window_s + self.cfg.grace_s, kind)
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
        """Score every window whose watermark has passed, those closed early for memory and
        those of evicted entities."""
        if self.clock is not None:
            self._now = self.clock()
        self._sweep()
        out, self._released = self._released, []
        return out + self._score(lambda d: d.windows.ready()) + self._shed()

    def drain(self) -> list[WindowResult]:
        """Close and score every open window (shutdown, end of a replay)."""
        out, self._released = self._released, []
        return out + self._score(lambda d: d.windows.drain())

    def window_bytes(self) -> int:
        """Estimated bytes of every entity's open windows and counter series."""
        return sum(d.windows.bytes for d in self.entities.values())

    def _shed(self) -> list[WindowResult]:
        """Close early the windows of each entity over max_entity_window_bytes, then of the
        largest entities while all together are over max_window_bytes."""
        cap = self.cfg.max_entity_window_bytes
        if (all(d.windows.bytes <= cap for d in self.entities.values())
                and self.window_bytes() <= self.cfg.max_window_bytes):
            return []
        dets = sorted(self.entities.values(), key=lambda d: -d.windows.bytes)
        over = [d for d in dets if d.windows.bytes > cap]
        left = sum(d.windows.bytes for d in dets[len(over):])
        for det in dets[len(over):]:
            if left <= self.cfg.max_window_bytes:
                break
            over.append(det)
            left -= det.windows.bytes
        out = []
        for det in over:
            held = det.windows.bytes
            wins = det.windows.shed()
            self.counters["entities.shed_memory"] += 1
            self.counters["windows.shed_memory"] += len(wins)
            self._warn_memory("%s: %d open windows closed early and counter series reset: ~%d bytes held "
                              "(max_entity_window_bytes=%d, max_window_bytes=%d for all); counted in "
                              "windows.shed_memory", entity_label(det.windows.entity), len(wins), held,
                              self.cfg.max_entity_window_bytes, self.cfg.max_window_bytes)
            out.extend(self._scored(det, wins))
        return out

    def _score(self, pick) -> list[WindowResult]:
        out = []
        for ent in sorted(self.entities):
            det = self.entities[ent]
            out.extend(self._scored(det, pick(det)))
        return out

    def _scored(self, det: EntityDetector, windows) -> list[WindowResult]:
        out = []
        for win in windows:
            res = det.score(win)
            self.counters["windows.scored" if res.score is not None else "windows.warmup"] += 1
            self.counters["windows.anomalous"] += res.anomalous
            out.append(res)
        return out
