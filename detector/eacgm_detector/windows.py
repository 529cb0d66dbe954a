"""Tumbling event-time windows per entity.

Windows are placed by the telemetry's own timestamps, so a recorded run replays to the same
windows as it produced live. Each entity has its own watermark (the newest event time seen
minus the grace period), which makes an entity's windows depend only on that entity's data:
the property that lets replicas routed by entity agree with a single detector.

Memory is bounded by counts (durations and levels per window, functions and metrics through
the vocabulary, span references) and, where a count bounds nothing (spans of any size,
counter series of any number), by an estimate of the bytes held: ``EntityWindows.bytes``,
which the pipeline holds to ``max_entity_window_bytes`` and ``max_window_bytes``.
"""

from __future__ import annotations

import heapq
import math
import random
import zlib
from array import array
from dataclasses import dataclass, field

import numpy as np

from eacgm_detector.records import Entity, MetricPoint, SpanRecord

#: Durations kept per function and window for the tail feature; beyond it a seeded
#: reservoir sample keeps memory flat and the result reproducible.
MAX_DURATIONS = 2048
#: Slowest spans remembered per function, to name affected spans in anomaly events.
SLOWEST_KEPT = 5
#: A cumulative series silent this long (or 10 windows, if longer) is forgotten: processes come
#: and go, and each leaves its series behind. Should it speak again, its next point is a new
#: baseline, as for a new series.
SERIES_IDLE_NS = 600 * 10**9
#: Share of a window the increments of a series that began in it must cover for a rate. Calls
#: come in bursts (training steps), so a count over a short interval is quantized coarsely: one
#: interval of 0.96 s held 7 steps of 126 ms where 7.6 were due, and a fresh process's first 2 s
#: window, holding that one interval, read 8 % below the job's rate (H200, 2026-12-04). A rate
#: left out is imputed as usual, not read as a slowdown.
MIN_NEW_SERIES_COVER = 0.75
#: Gauge levels and delta increments kept per feature series and window; beyond it the
#: window's sum, count and max of levels are kept as running figures, so the list stops growing.
MAX_VALUES = 2048

# Estimated bytes of what the windows hold (CPython, 64-bit), for EntityWindows.bytes. They
# round up what sys.getsizeof and tracemalloc show for each structure.
#: A Window and its dicts.
WINDOW_BYTES = 2048
#: A FunctionStats, its key and its heap of slowest spans; its durations count apart.
FUNCTION_BYTES = 2048
#: One duration (an array of doubles).
DURATION_BYTES = 8
#: One kept span besides its serialized bytes: the tuple, the bytes objects' headers, the slot.
REF_BYTES = 160
#: A MetricStats and its dict entry.
METRIC_BYTES = 1024
#: One level or increment (a float in a list).
VALUE_BYTES = 32
#: One cumulative series' entry in an entity's state or a window's increments, besides its key.
SERIES_BYTES = 256
#: A window's note that a series began in it (its key is the one the entity holds).
STARTED_BYTES = 64


@dataclass
class FunctionStats:
    """Span aggregates of one (layer, function) in one window."""

    count: int = 0
    errors: int = 0
    log_durations: array = field(default_factory=lambda: array("d"))
    nccl_bytes: float = 0.0
    nccl_seconds: float = 0.0
    slowest: list[tuple[float, bytes, bytes]] = field(default_factory=list)

    def add(self, rec: SpanRecord, rng: random.Random) -> int:
        """Fold one span in; return the bytes it added."""
        self.count += 1
        self.errors += rec.error
        ld = math.log(max(rec.duration_s, 1e-9))
        added = 0
        if len(self.log_durations) < MAX_DURATIONS:
            self.log_durations.append(ld)
            added = DURATION_BYTES
        else:
            j = rng.randrange(self.count)
            if j < MAX_DURATIONS:
                self.log_durations[j] = ld
        if rec.nccl_bytes is not None:
            self.nccl_bytes += rec.nccl_bytes
            self.nccl_seconds += rec.duration_s
        item = (rec.duration_s, rec.trace_id, rec.span_id)
        if len(self.slowest) < SLOWEST_KEPT:
            heapq.heappush(self.slowest, item)
        else:
            heapq.heappushpop(self.slowest, item)
        return added


@dataclass
class MetricStats:
    """Metric aggregates of one feature series in one window.

    A feature series can hold many OTLP series (one per process and function for the call
    statistics), so cumulative increments are kept per OTLP series: the window's rate is
    the sum of their rates. Dividing the summed increase by the summed seconds instead
    would be the *mean* rate per series, which falls with every series that stopped
    counting (functions a process called only while starting), a number that differs from
    one process to the next.
    """

    kind: str
    #: Gauge levels; delta increments (the first MAX_VALUES; ``overflow`` has the rest).
    values: list[float] = field(default_factory=list)
    #: Count, sum and max of the levels beyond MAX_VALUES.
    overflow: list[float] = field(default_factory=lambda: [0, 0.0, -math.inf])
    #: What the window's delta points or cumulative increments added, all series together.
    increase: float = 0.0
    #: Per cumulative OTLP series, [increase, seconds] of the increments placed here; the
    #: seconds let a window that saw one increment of two (the series' first point) still
    #: give the right rate.
    increments: dict[tuple, list[float]] = field(default_factory=dict)
    #: Cumulative OTLP series whose first point (a baseline) fell in this window.
    started: set[tuple] = field(default_factory=set)

    def has_data(self) -> bool:
        """Whether the window holds a level or an increase of this series."""
        return bool(self.values or self.increments)

    def add_value(self, value: float) -> int:
        """Keep a level or an increment; return the bytes it added."""
        if len(self.values) < MAX_VALUES:
            self.values.append(value)
            return VALUE_BYTES
        self.overflow[0] += 1
        self.overflow[1] += value
        self.overflow[2] = max(self.overflow[2], value)
        return 0

    def mean(self) -> float:
        """Mean of the levels."""
        n, total, _ = self.overflow
        return float(np.mean(self.values)) if not n else (math.fsum(self.values) + total) / (len(self.values) + n)

    def max(self) -> float:
        """Largest level."""
        return max(float(np.max(self.values)), self.overflow[2])

    def rate(self, window_s: float) -> float:
        """Per second: delta increments over the window, cumulative ones per OTLP series; NaN
        (unknown) when a series began in the window and its increments cover less than
        ``MIN_NEW_SERIES_COVER`` of it, as every series of a process that just started does."""
        if self.kind == "delta":
            return self.increase / window_s
        if any(self.increments.get(key, (0.0, 0.0))[1] < MIN_NEW_SERIES_COVER * window_s for key in self.started):
            return math.nan
        return sum(inc / secs for inc, secs in self.increments.values())


@dataclass
class Window:
    """Everything an entity produced in ``[start_ns, end_ns)``."""

    entity: Entity
    start_ns: int
    end_ns: int
    functions: dict[tuple[str, str], FunctionStats] = field(default_factory=dict)
    metrics: dict[str, MetricStats] = field(default_factory=dict)
    span_refs: list[tuple] = field(default_factory=list)
    refs_dropped: int = 0
    #: Estimated bytes this window holds.
    bytes: int = WINDOW_BYTES


class EntityWindows:
    """Open windows of one entity, closed when the watermark passes their end plus grace.

    Parameters
    ----------
    window_ns, grace_ns : int
        Window length and how long after a window's end late data is still accepted.
    function_key : callable
        Maps (layer, function) to its bounded feature key (see ``features.Vocabulary``).
    metric_key : callable
        Maps a metric point to its bounded feature series name, or None to leave it out.
    max_open : int
        Open windows kept at most; the oldest is closed early beyond it, so a burst of
        scattered timestamps cannot grow memory without bound.
    max_span_refs : int
        Span protos kept per window for annotated re-export.
    """

    def __init__(self, entity: Entity, *, window_ns: int, grace_ns: int, function_key,
                 metric_key, max_open: int = 16, max_span_refs: int = 10000) -> None:
        self.entity = entity
        self.window_ns = window_ns
        self.grace_ns = grace_ns
        self._function_key = function_key
        self._metric_key = metric_key
        self.max_open = max_open
        self.max_span_refs = max_span_refs
        self._open: dict[int, Window] = {}
        self._closed_before = -1
        self._newest = -1
        # (name, series) -> (time, value, start time, estimated bytes) of the series' last point
        self._last_cumulative: dict[tuple, tuple[int, float, int, int]] = {}
        self.late = 0
        self.excluded = 0
        self.bytes = 0
        """Estimated bytes of the open windows and the cumulative series' state."""

    def _window(self, t: int) -> Window | None:
        start = t - t % self.window_ns
        if start + self.window_ns <= self._closed_before:
            self.late += 1
            return None
        self._newest = max(self._newest, t)
        win = self._open.get(start)
        if win is None:
            win = self._open[start] = Window(self.entity, start, start + self.window_ns)
            self.bytes += win.bytes
        return win

    def _grew(self, win: Window, added: int) -> None:
        win.bytes += added
        self.bytes += added

    def add_span(self, rec: SpanRecord) -> bool:
        """Add a span; False when it arrived after its window closed (counted in ``late``)."""
        win = self._window(rec.time_ns)
        if win is None:
            return False
        key = self._function_key(rec.layer, rec.function)
        stats = win.functions.get(key)
        added = 0
        if stats is None:
            stats = win.functions[key] = FunctionStats()
            added = FUNCTION_BYTES + len(key[0]) + len(key[1])
        added += stats.add(rec, random.Random(win.start_ns ^ zlib.crc32('\0'.join(key).encode())))
        if rec.ref is not None:
            if len(win.span_refs) < self.max_span_refs:
                win.span_refs.append(rec.ref)
                added += REF_BYTES + len(rec.ref[4])  # resource and scope are shared by many spans
            else:
                win.refs_dropped += 1
        self._grew(win, added)
        return True

    def add_point(self, p: MetricPoint) -> bool:
        """Add a metric point; False when late. A point of an excluded metric is accepted,
        counted in ``excluded`` and goes no further: it opens no window and moves no
        watermark, so an entity that sends only those produces no empty windows."""
        name = self._metric_key(p)
        if name is None:
            self.excluded += 1
            return True
        win = self._window(p.time_ns)
        if win is None:
            return False
        stats = win.metrics.get(name)
        if stats is not None and stats.kind != p.kind:
            # One feature, one kind: a gauge and a counter of the same name (or sharing the
            # ``other`` bucket) would mix levels with increments, and a delta point in a
            # cumulative series has no time span to divide by.
            name = f"{name}.{p.kind}"
            stats = win.metrics.get(name)
        added = 0
        if stats is None:
            stats = win.metrics[name] = MetricStats(p.kind)
            added = METRIC_BYTES + len(name)
        if p.kind == "gauge":
            added += stats.add_value(p.value)
        elif p.kind == "delta":
            stats.increase += p.value
            added += stats.add_value(p.value)
        else:
            added += self._add_cumulative(stats, p)
        self._grew(win, added)
        return True

    def _add_cumulative(self, stats: MetricStats, p: MetricPoint) -> int:
        """The increase since the series' previous point, placed in the window of the newer
        point. A new process's series starts from its first point (a baseline: what it counted
        before says nothing about this window), and so does a restart, a new start time or a
        value that dropped, unless the point says it started after the previous one, when the
        whole value is what it counted since. Either way no restart becomes a spike. Returns
        the bytes added to the window (the series' own state is counted in ``bytes`` here)."""
        key = (p.name, p.series)
        prev = self._last_cumulative.get(key)
        if prev is not None and p.time_ns <= prev[0]:
            return 0  # a repeat or an older point: its increase is already counted
        cost = prev[3] if prev is not None else SERIES_BYTES + _key_bytes(key)
        self._last_cumulative[key] = (p.time_ns, p.value, p.start_ns, cost)
        if prev is None:
            self.bytes += cost
            return _mark_started(stats, key, STARTED_BYTES)
        prev_ns, prev_value, prev_start, _ = prev
        restarted = p.value < prev_value or bool(p.start_ns and prev_start and p.start_ns != prev_start)
        if not restarted:
            increase, since = p.value - prev_value, prev_ns
        elif prev_ns <= p.start_ns < p.time_ns:
            increase, since = p.value, p.start_ns
        else:
            return _mark_started(stats, key, STARTED_BYTES + cost - SERIES_BYTES)  # a new baseline
        part = stats.increments.get(key)
        if part is None:
            part = stats.increments[key] = [0.0, 0.0]
            added = cost
        else:
            added = 0
        part[0] += increase
        part[1] += (p.time_ns - since) / 1e9
        stats.increase += increase
        return added

    def ready(self) -> list[Window]:
        """Pop the windows the watermark has passed, oldest first."""
        watermark = self._newest - self.grace_ns
        starts = sorted(s for s, w in self._open.items() if w.end_ns <= watermark)
        extra = len(self._open) - len(starts) - self.max_open
        if extra > 0:
            rest = sorted(s for s in self._open if s not in starts)
            starts += rest[:extra]
        return self._pop(starts)

    def drain(self) -> list[Window]:
        """Pop every open window (shutdown, end of a recorded file)."""
        return self._pop(sorted(self._open))

    def shed(self) -> list[Window]:
        """Pop every open window and forget every cumulative series, to free memory: each
        series' next point is a new baseline, as after a restart; data for the popped windows
        arriving later is late."""
        out = self.drain()
        self._last_cumulative.clear()
        self.bytes = 0
        return out

    def _pop(self, starts: list[int]) -> list[Window]:
        out = [self._open.pop(s) for s in starts]
        if out:
            self.bytes -= sum(w.bytes for w in out)
            self._closed_before = max(self._closed_before, out[-1].end_ns)
            idle_before = self._closed_before - max(SERIES_IDLE_NS, 10 * self.window_ns)
            for key in [k for k, v in self._last_cumulative.items() if v[0] < idle_before]:
                self.bytes -= self._last_cumulative.pop(key)[3]
        return out


def _mark_started(stats: MetricStats, key: tuple, cost: int) -> int:
    if key in stats.started:
        return 0
    stats.started.add(key)
    return cost


def _key_bytes(key: tuple) -> int:
    """Estimated bytes of a cumulative series' key: (name, ((attribute, value), ...))."""
    name, series = key
    return 150 + len(name) + sum(160 + len(k) + len(v) for k, v in series)
