"""The record path, as a line: ring buffer -> decode -> span -> shape -> export queue.

One handler per event type (the record's type byte), looked up once per record. Call records
become spans (SpanBuilder), feed what the call statistics learn from them, and go to the trace
shaper, which hands whole traces to the export queue; library opens and execs go to discovery;
a thread's exit turns the frames it left open into incomplete calls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from otel_eacgm.bpf_program import CallProgram
from otel_eacgm.discovery import Discovery
from otel_eacgm.events import (PY_PROBE_ID, CallEvent, CallFlags, CallStrEvent, EventType, ExecEvent, LibOpenEvent,
                               PyCallEvent, PyStackEvent, ThreadExitEvent, decode)
from otel_eacgm.metrics.call_stats import CallStatistics
from otel_eacgm.probes.catalog import ProbeSpec
from otel_eacgm.pyframes.frame_spans import FrameSpans
from otel_eacgm.shaping import TraceShaper
from otel_eacgm.spans import SpanBuilder
from otel_eacgm.telemetry import Counters

log = logging.getLogger(__name__)


class RecordPipeline:
    """Consumes ring-buffer records (the program's ring callback) in the agent's process."""

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
            EventType.CALL: self._on_call,
            EventType.CALL_STR: self._on_call_with_string,
            EventType.PY_CALL: self._on_python_call,
            EventType.THREAD_EXIT: self._on_thread_exit,
            EventType.LIB_OPEN: self._on_library_open,
            EventType.EXEC: self._on_exec,
            EventType.FORK_HELD: self._on_fork_held,
            EventType.PY_STACK: self._on_python_stack,
        }

    def on_record(self, data: int, size: int) -> None:
        """The ring callback: one record at `data` of `size` bytes."""
        try:
            event_type, rec = decode(data, size)
            self._handlers[event_type](rec)
        except Exception:  # one bad record must not stop the capture loop
            self._counters.decode_errors += 1
            log.exception("dropping an undecodable ring-buffer record (%d bytes)", size)

    def _on_call(self, ev: CallEvent, string: bytes | None = None) -> None:
        line = None
        if self._frames is not None and not ev.parent_id and ev.probe_id != PY_PROBE_ID:
            ev.parent_id, line = self._frames.parent_of(ev)
        self._emit(ev, self._builder.build(ev, string, python_line=line), python=False)

    def _on_python_stack(self, rec: PyStackEvent) -> None:
        if self._frames is not None:
            self._frames.on_stack(rec)

    def _on_call_with_string(self, rec: CallStrEvent) -> None:
        self._on_call(rec.call, rec.str)

    def _on_python_call(self, rec: PyCallEvent) -> None:
        self._emit(rec.call, self._builder.build_python(rec.call, rec.func, rec.file), python=True)

    def _emit(self, ev: CallEvent, span: ReadableSpan, *, python: bool) -> None:
        self._counters.calls += 1
        if self._call_stats is not None:
            self._learn(ev, span, python)
        self._shaper.add(span, call_id=ev.call_id, parent_id=ev.parent_id, pid=ev.pid, tid=ev.tid,
                         now=time.monotonic(), sampled=bool(ev.flags & CallFlags.SAMPLED))

    def _learn(self, ev: CallEvent, span: ReadableSpan, python: bool) -> None:
        """What the statistics need from call records: Python names, communicator sizes, and
        the calls a dead thread left open (the kernel never saw them end)."""
        assert self._call_stats is not None
        a = span.attributes or {}
        if python:
            self._call_stats.learn_python(ev.pid, list(ev.args), str(a.get("code.function.name", span.name)))
        elif "nccl.nranks" in a and ev.flags & CallFlags.OUT and ev.ret == 0:
            self._call_stats.learn_communicator(ev.pid, ev.out_value, int(a["nccl.nranks"]))  # type: ignore[arg-type]
        if ev.flags & CallFlags.INCOMPLETE:
            self._call_stats.incomplete(ev.pid, None if python else self._rows.get(ev.probe_id), span.name)

    def _on_thread_exit(self, rec: ThreadExitEvent) -> None:
        self._shaper.forget_thread(rec.tid)
        for ev in self._program.pop_frames(rec.pid, rec.tid, rec.depth):
            ev.flags |= CallFlags.INCOMPLETE
            ev.exit_ns = rec.exit_ns
            self._counters.incomplete += 1
            self._on_call(ev)

    def _on_library_open(self, rec: LibOpenEvent) -> None:
        self._discovery.on_library_open(rec, time.monotonic())

    def _on_exec(self, rec: ExecEvent) -> None:
        self._discovery.on_exec(rec)

    def _on_fork_held(self, rec: ExecEvent) -> None:
        self._discovery.on_fork_held(rec)
