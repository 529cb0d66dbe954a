"""The record path, as a line: ring buffer -> decode -> span -> shape -> export queue.

Records come in batches (one ring-buffer poll). Runs of call records (CALL, CALL_STR,
PY_CALL: all start with a CallEvent) are decoded in one numpy view and their span ids mixed
in one pass (events.decode_calls, SpanIds.span_ids); the other records go one by one to the
handler of their type byte, in ring order. Call records become spans (SpanBuilder), feed what
the call statistics learn from them, and go to the trace shaper, which hands whole traces to
the export queue; library opens and execs go to discovery; a thread's exit turns the frames
it left open into incomplete calls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from otel_eacgm.bpf_program import CallProgram
from otel_eacgm.discovery import Discovery
from otel_eacgm.events import (CALL_SIZE, FUNC_BYTES, PATH_BYTES, PY_PROBE_ID, STR_BYTES, Call, CallFlags,
                               EventType, ExecEvent, LibOpenEvent, PyStackEvent, ThreadExitEvent, call_record, decode,
                               decode_calls)
from otel_eacgm.metrics.call_stats import CallStatistics
from otel_eacgm.probes.catalog import ProbeSpec
from otel_eacgm.pyframes.frame_spans import FrameSpans
from otel_eacgm.shaping import TraceShaper
from otel_eacgm.spans import CallSpan, SpanBuilder
from otel_eacgm.telemetry import Counters

log = logging.getLogger(__name__)


_CALLS = frozenset((EventType.CALL, EventType.CALL_STR, EventType.PY_CALL))
_SAMPLED = int(CallFlags.SAMPLED)
_PY_CALL = int(EventType.PY_CALL)
_CALL_STR = int(EventType.CALL_STR)
_OUT = int(CallFlags.OUT)
_INCOMPLETE = int(CallFlags.INCOMPLETE)


def _text(record: bytes, start: int, size: int) -> bytes:
    """A NUL-terminated char[size] field of a record (as ctypes reads c_char arrays)."""
    return record[start:start + size].split(b"\0", 1)[0]


class RecordPipeline:
    """Consumes ring-buffer records, a poll's batch at a time, in the agent's process."""

    def __init__(self, *, program: CallProgram, builder: SpanBuilder, shaper: TraceShaper, discovery: Discovery,
                 call_stats: CallStatistics | None, rows: dict[int, ProbeSpec], counters: Counters,
                 frames: FrameSpans | None = None) -> None:
        self._program = program
        self._builder = builder
        self._shaper = shaper
        self._discovery = discovery
        self._call_stats = call_stats
        self._rows = rows
        self._counters = counters
        self._frames = frames
        self._handlers: dict[EventType, Callable[[Any], None]] = {
            EventType.THREAD_EXIT: self._on_thread_exit,
            EventType.LIB_OPEN: self._on_library_open,
            EventType.EXEC: self._on_exec,
            EventType.FORK_HELD: self._on_fork_held,
            EventType.PY_STACK: self._on_python_stack,
        }

    def on_batch(self, records: list[bytes]) -> None:
        """One poll's records, in ring order: runs of calls in bulk, the others one by one."""
        run: list[bytes] = []
        for record in records:
            if record and record[0] in _CALLS:
                run.append(record)
                continue
            if run:
                self._calls(run)
                run = []
            self._other(record)
        if run:
            self._calls(run)

    def _other(self, record: bytes) -> None:
        try:
            event_type, rec = decode(record)
            handler = self._handlers.get(event_type)
            if handler is None:
                raise ValueError(f"a {event_type.name} record outside a run of calls")
            handler(rec)
        except Exception:  # one bad record must not stop the capture loop
            self._counters.decode_errors += 1
            log.exception("dropping an undecodable ring-buffer record (%d bytes)", len(record))

    def _calls(self, records: list[bytes]) -> None:
        """A run of call records: decoded together, then each made a span."""
        try:
            calls, rows = decode_calls(records)
        except Exception:
            self._counters.decode_errors += len(records)
            log.exception("dropping %d undecodable call records", len(records))
            return
        ids = self._builder.ids
        span_ids = ids.span_ids(rows["call_id"])
        parent_span_ids = ids.span_ids(rows["parent_id"])
        frames = self._frames
        shaper_add = self._shaper.add
        build = self._builder.build
        now = time.monotonic()  # the shaper's delay bound: one reading per batch is precise enough
        counters, call_stats = self._counters, self._call_stats
        failed = 0
        for ev, record, span_id, parent_span_id in zip(calls, records, span_ids, parent_span_ids):
            try:
                kind = record[0]
                parent_id = ev.parent_id
                if kind == _PY_CALL:
                    span = self._builder.build_python(ev, span_id, parent_span_id, _text(record, CALL_SIZE, FUNC_BYTES),
                                                      _text(record, CALL_SIZE + FUNC_BYTES, PATH_BYTES))
                else:
                    line = None
                    if frames is not None and not parent_id and ev.probe_id != PY_PROBE_ID:
                        parent_id, line = frames.parent_of(ev)
                        parent_span_id = ids.span_id(parent_id) if parent_id else 0
                    string = _text(record, CALL_SIZE, STR_BYTES) if kind == _CALL_STR else None
                    span = build(ev, span_id, parent_span_id, string, line)
                if call_stats is not None:
                    self._learn(ev, span, kind == _PY_CALL)
                shaper_add(span, ev.call_id, parent_id, ev.pid, ev.tid, now, bool(ev.flags & _SAMPLED))
            except Exception:  # one bad record must not stop the capture loop
                failed += 1
                log.exception("dropping an undecodable call record (%d bytes)", len(record))
        counters.calls += len(calls) - failed
        counters.decode_errors += failed

    def _learn(self, ev: Call, span: CallSpan, python: bool) -> None:
        """What the statistics need from call records: Python names, communicator sizes, and
        the calls a dead thread left open (the kernel never saw them end)."""
        assert self._call_stats is not None
        a = span.attributes  # the decoded arguments (nccl.nranks); a Python span has no shared `fixed` part
        if python:
            self._call_stats.learn_python(ev.pid, list(ev.args), str(a.get("code.function.name", span.name)))
        elif "nccl.nranks" in a and ev.flags & _OUT and ev.ret == 0:
            self._call_stats.learn_communicator(ev.pid, ev.out_value, int(a["nccl.nranks"]))  # type: ignore[arg-type]
        if ev.flags & _INCOMPLETE:
            self._call_stats.incomplete(ev.pid, None if python else self._rows.get(ev.probe_id), span.name)

    def _on_python_stack(self, rec: PyStackEvent) -> None:
        if self._frames is not None:
            self._frames.on_stack(rec)

    def _on_thread_exit(self, rec: ThreadExitEvent) -> None:
        self._shaper.forget_thread(rec.tid)
        left = []
        for ev in self._program.pop_frames(rec.pid, rec.tid, rec.depth):
            ev.flags |= CallFlags.INCOMPLETE
            ev.exit_ns = rec.exit_ns
            self._counters.incomplete += 1
            left.append(call_record(ev))
        if left:
            self._calls(left)

    def _on_library_open(self, rec: LibOpenEvent) -> None:
        self._discovery.on_library_open(rec, time.monotonic())

    def _on_exec(self, rec: ExecEvent) -> None:
        self._discovery.on_exec(rec)

    def _on_fork_held(self, rec: ExecEvent) -> None:
        self._discovery.on_fork_held(rec)
