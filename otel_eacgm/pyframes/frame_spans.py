"""Python spans from walked frames: the traced calls one Python frame made become its children.

Each outermost traced call of a Python process arrives after its frames (py_stack_event,
innermost first). Per thread the frames still open are kept, outermost first; a new stack is
matched against them from the outermost frame: a frame is the same activation when its code is
the same and every frame outside it was at the same instruction. Where they part, the open
frames from there in are closed (their spans sent, innermost first, so children always come
before parents as the trace shaper expects) and the new ones opened.

A frame's span starts at the first traced call under it and ends with the last: the frame's
own entry and exit are not observed (``eacgm.python.bounds`` says so). An activation whose
instruction went backwards, with every frame outside it unchanged, is taken for a new one (the
next step of a loop calling it): consecutive calls of one function from one call site are then
separate spans, and a loop inside a function that makes traced calls shows as one span per pass.

Frames the include/exclude rules leave out, or whose code object cannot be read any more, make
no span but still count for matching; calls are children of the nearest frame with a span.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence

from opentelemetry.sdk.resources import Resource

from otel_eacgm.clock import EpochClock
from otel_eacgm.events import Call, CallFlags, PyStackEvent, PyWalk
from otel_eacgm.probes.catalog import Layer
from otel_eacgm.probes.python_usdt import Rule, rule_matches
from otel_eacgm.pyframes.code_objects import CodeInfo, CodeReader
from otel_eacgm.python_names import PythonNames, module_name
from otel_eacgm.spans import CallSpan, SpanIds

FRAME_ID_BASE = 1 << 63  # frame span ids live above every kernel call id
BOUNDS = "traced_calls"  # eacgm.python.bounds: start and end are the first and last traced call's

Sink = Callable[..., None]  # TraceShaper.add


@dataclasses.dataclass
class _Frame:
    code: int
    firstlineno: int
    instr: int
    span_id: int          # 0: no span (excluded or unreadable)
    parent_id: int        # nearest enclosing frame with a span, 0: none
    name: str = ""
    attrs: dict = dataclasses.field(default_factory=dict)
    start_ns: int = 0
    end_ns: int = 0
    sampled: bool = False


@dataclasses.dataclass
class FrameCounters:
    """What the frame spans saw (agent summary)."""

    stacks: int = 0        # py_stack_event records
    truncated: int = 0     # walks that did not reach the outermost frame (deep or torn)
    no_thread: int = 0     # calls on threads without a Python thread state
    spans: int = 0         # frame spans sent
    unnamed: int = 0       # frames whose code object was gone or changed when read


class FrameSpans:
    """Turns py_stack_event records into parents for outermost calls, and frame spans."""

    def __init__(self, reader: CodeReader, rules: Sequence[Rule], default_include: bool, ids: SpanIds,
                 clock: EpochClock, resource_for: Callable[[int], Resource], sink: Sink) -> None:
        self._reader = reader
        self._rules = list(rules)
        self._default_include = default_include
        self._ids = ids
        self._clock = clock
        self._resource_for = resource_for
        self._sink = sink
        self._minor: dict[int, int] = {}
        self._pending: dict[tuple[int, int], PyStackEvent] = {}
        self._open: dict[tuple[int, int], list[_Frame]] = {}
        self._next = itertools.count(1)
        self._names = PythonNames()
        self._included: dict[tuple[str, str], bool] = {}
        self.counters = FrameCounters()

    # --- processes ------------------------------------------------------------------------
    def track(self, pid: int, minor: int) -> None:
        """`pid` runs CPython 3.`minor`, whose frames the kernel now walks."""
        self._minor[pid] = minor

    def forget(self, pid: int) -> None:
        """`pid` exited or executed another program: close its frames, drop what it left."""
        for key in [k for k in self._open if k[0] == pid]:
            self._close(key, 0)
        self._pending = {k: v for k, v in self._pending.items() if k[0] != pid}
        self._minor.pop(pid, None)
        self._reader.forget(pid)

    # --- records --------------------------------------------------------------------------
    def on_stack(self, rec: PyStackEvent) -> None:
        """The frames of the call `rec.call_id`, whose record comes next."""
        self.counters.stacks += 1
        if len(self._pending) > 4096:  # records lost: never grow without bound
            self._pending.clear()
        self._pending[(rec.pid, rec.call_id)] = rec

    def parent_of(self, ev: Call) -> tuple[int, int | None]:
        """(frame span id to parent the outermost call `ev` under, 0: none; the line of the
        innermost Python frame that made it, None: unknown). Closes the frames it left."""
        rec = self._pending.pop((ev.pid, ev.call_id), None)
        if rec is None or ev.pid not in self._minor:
            return 0, None
        if rec.status == PyWalk.NO_THREAD:
            self.counters.no_thread += 1
            return 0, None
        if rec.status != PyWalk.DONE:  # outer frames missing: nothing to match from the top
            self.counters.truncated += 1
            return 0, None
        key = (ev.pid, ev.tid)
        frames = list(reversed([(f.code, f.firstlineno, f.instr) for f in rec.frames[:rec.count] if f.code]))
        opened = self._open.get(key, [])
        shared = 0
        for depth, (code, first, instr) in enumerate(frames):
            if depth >= len(opened):
                break
            old = opened[depth]
            if old.code != code or old.firstlineno != first:
                break
            if old.instr != instr:
                if instr > old.instr:  # the same activation, further on: it stays, those inside go
                    shared = depth + 1
                break
            shared = depth + 1
        self._close(key, shared)
        opened = self._open.setdefault(key, [])
        line = None
        for depth, (code, first, instr) in enumerate(frames):
            if depth < shared:
                opened[depth].instr = instr
                continue
            parent = next((f.span_id for f in reversed(opened) if f.span_id), 0)
            opened.append(self._opened(ev, code, first, instr, parent))
        sampled = bool(ev.flags & CallFlags.SAMPLED)
        for frame in opened:
            if frame.span_id:
                frame.start_ns = min(frame.start_ns, ev.entry_ns) if frame.start_ns else ev.entry_ns
                frame.end_ns = max(frame.end_ns, ev.exit_ns)
                frame.sampled |= sampled
        if frames:
            info = self._reader.info(ev.pid, frames[-1][0], frames[-1][1])
            line = info.line_of(frames[-1][2], self._minor[ev.pid]) if info is not None else None
        if not opened:
            del self._open[key]
        return next((f.span_id for f in reversed(opened) if f.span_id), 0), line

    def tick(self, now_ns: int, idle_ns: int) -> None:
        """Close the frames of threads that made no traced call for `idle_ns`."""
        for key in [k for k, frames in self._open.items() if frames and max(f.end_ns for f in frames) < now_ns - idle_ns]:
            self._close(key, 0)

    def flush(self) -> None:
        """Close every open frame (the agent stops)."""
        for key in list(self._open):
            self._close(key, 0)

    # --- frames ---------------------------------------------------------------------------
    def _opened(self, ev: Call, code: int, first: int, instr: int, parent: int) -> _Frame:
        info = self._reader.info(ev.pid, code, first)
        frame = _Frame(code, first, instr, 0, parent)
        if info is None:
            self.counters.unnamed += 1
            return frame
        if not self._include(info):
            return frame
        qualname, qualified = self._qualified(ev.pid, info)
        frame.span_id = FRAME_ID_BASE | next(self._next)
        frame.name = qualname
        frame.attrs = {
            "eacgm.layer": Layer.PYTHON.value,
            "code.function.name": qualified,
            "code.file.path": info.file,
            "code.line.number": info.firstlineno,
            "eacgm.python.bounds": BOUNDS,
            "process.pid": ev.pid,
            "thread.id": ev.tid,
        }
        return frame

    def _qualified(self, pid: int, info: CodeInfo) -> tuple[str, str]:
        """(qualified name, module-qualified name). Before 3.11 code objects carry no qualified
        name: the source file gives it (python_names)."""
        if self._minor.get(pid, 11) < 11:
            return self._names.names(pid, info.file, info.name, info.firstlineno)
        module = module_name(info.file)
        return info.qualname, f"{module}.{info.qualname}" if module and not module.startswith("<") else info.qualname

    def _include(self, info: CodeInfo) -> bool:
        key = (info.file, info.name)
        hit = self._included.get(key)
        if hit is None:
            hit = next((r.include for r in self._rules if rule_matches(r, info.file, info.name)), self._default_include)
            if len(self._included) > 65536:
                self._included.clear()
            self._included[key] = hit
        return hit

    def _close(self, key: tuple[int, int], keep: int) -> None:
        """Send the spans of the open frames of thread `key` from depth `keep` in, innermost first."""
        opened = self._open.get(key)
        if not opened:
            return
        pid, tid = key
        for frame in reversed(opened[keep:]):
            if not frame.span_id or not frame.start_ns:
                continue
            span = CallSpan(frame.name, self._ids.span_id(frame.span_id),
                            self._ids.span_id(frame.parent_id) if frame.parent_id else 0,
                            self._clock.to_epoch(frame.start_ns), self._clock.to_epoch(frame.end_ns), frame.attrs,
                            None, self._resource_for(pid))
            self.counters.spans += 1
            self._sink(span, call_id=frame.span_id, parent_id=frame.parent_id, pid=pid, tid=tid,
                       sampled=frame.sampled)
        del opened[keep:]
        if not opened:
            del self._open[key]
