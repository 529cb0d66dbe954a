"""Trace shaping and sampling: readable traces of bounded size, and volume control.

Calls complete children first, so when a call's record arrives every call under it has already
arrived. The shaper holds each open call's completed subtrees until the call itself completes:

* an outermost call (no parent on its thread) is emitted with everything under it as one trace
  (one training step, one request);
* when the calls held under one open call would exceed ``max_spans``, or have waited longer
  than ``max_delay_s`` (a ``main()`` that runs for hours), each held child subtree is emitted
  as a trace of its own, rooted at the child, which keeps its parent's span id in
  ``eacgm.parent.span_id``; the parent later ends up in a trace with the children still held;
* outermost calls with nothing under them (a CUDA call made straight from a C loop) share one
  trace per thread and time slice (``slice_s``; 0: each its own trace).

Sampling is decided in the kernel (bpf/calls.bpf.c ``in_sample``), which sends a call only
when it is in the sample, slow, failed or an ancestor of a sent call, and marks the sampled
ones. Here a trace whose root is marked is exported whole; from any other trace only the spans
that are slow (>= ``slow_s``) or failed are exported, with their ancestors in the trace so that
they are not orphans. Every call still feeds the call statistics, counted in the kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from otel_eacgm.spans import CallSpan, SpanIds


@dataclasses.dataclass
class _Node:
    span: CallSpan
    call_id: int
    parent_id: int
    pid: int
    tid: int
    sampled: bool


@dataclasses.dataclass
class _Held:
    """Completed child subtrees of one open call."""

    since: float
    children: list[list[_Node]] = dataclasses.field(default_factory=list)
    count: int = 0


@dataclasses.dataclass
class ShapingCounters:
    """What the shaper did (agent summary and self-telemetry)."""

    root_spans: int = 0     # spans exported without a parent: outermost calls and split-off subtrees
    traces: int = 0         # distinct trace ids exported: lone outermost calls of a thread share one per slice
    split: int = 0          # child subtrees emitted on their own (size or delay bound)
    sampled_out: int = 0    # spans not exported by sampling
    held: int = 0           # spans held now, waiting for their parents


class TraceShaper:
    """Groups spans into traces and samples them; `sink` receives the spans to export."""

    def __init__(self, sink: Callable[[CallSpan], None], ids: SpanIds, *, max_spans: int = 1000,
                 max_delay_s: float = 10.0, slice_s: float = 1.0, slow_s: float = 0.1) -> None:
        if max_spans < 1:
            raise ValueError(f"trace max_spans {max_spans} must be >= 1")
        self._sink = sink
        self._ids = ids
        self.max_spans = max_spans
        self.max_delay_s = max_delay_s
        self.slice_s = slice_s
        self.slow_ns = int(slow_s * 1e9)
        self._held: dict[int, _Held] = {}
        self._slices: dict[tuple[int, int], tuple[int, int]] = {}  # (pid, tid) -> its last slice: index, trace id
        self.counters = ShapingCounters()

    # --- input ----------------------------------------------------------------------------
    def add(self, span: CallSpan, call_id: int, parent_id: int, pid: int, tid: int, now: float,
            sampled: bool = True) -> None:
        """One completed call (children always come before their parent); `sampled`: the kernel
        put it in the span sample."""
        held = self._held.pop(call_id, None) if self._held else None
        if not parent_id and held is None and self.slice_s > 0:
            self._lone(span, pid, tid, sampled)  # the common case of calls straight from native code
            return
        node = _Node(span, call_id, parent_id, pid, tid, sampled)
        subtree = [node]
        if held is not None:
            self.counters.held -= held.count
            for child in held.children:
                subtree.extend(child)
        if not parent_id:
            if len(subtree) == 1 and self.slice_s > 0:
                self._lone(span, pid, tid, sampled)
            else:
                self._emit(subtree, self._ids.trace_id(call_id), cut=False)
            return
        if len(subtree) >= self.max_spans:
            self._emit(subtree, self._ids.trace_id(call_id), cut=True)
            self.counters.split += 1
            return
        parent = self._held.get(parent_id)
        if parent is None:
            parent = self._held[parent_id] = _Held(since=now)
        if parent.count + len(subtree) + 1 > self.max_spans:  # + 1: the parent itself
            self._split(parent)
            parent.since = now
        parent.children.append(subtree)
        parent.count += len(subtree)
        self.counters.held += len(subtree)

    def tick(self, now: float) -> None:
        """Emit subtrees held longer than max_delay_s under calls that are still open."""
        for held in self._held.values():
            if held.children and now - held.since >= self.max_delay_s:
                self._split(held)
                held.since = now

    def flush(self) -> None:
        """Emit everything held (at exit: parents that never returned are gone)."""
        for held in list(self._held.values()):
            self._split(held)
        self._held.clear()
        self.counters.held = 0

    def forget_thread(self, tid: int) -> None:
        """A thread died: its open calls are reported as incomplete by the agent; its slice is done."""
        for key in [k for k in self._slices if k[1] == tid]:
            del self._slices[key]

    # --- output ---------------------------------------------------------------------------
    def _lone(self, span: CallSpan, pid: int, tid: int, sampled: bool) -> None:
        """An outermost call with nothing under it: into its thread's trace of this time slice."""
        index = int(span.start / 1e9 // self.slice_s) if span.start else 0
        last = self._slices.get((pid, tid))
        shared = last is not None and last[0] == index
        if not sampled and span.end - span.start < self.slow_ns and span.error is None:
            self.counters.sampled_out += 1
            return
        self.counters.root_spans += 1
        if shared:
            span.trace_id = last[1]  # type: ignore[index]
        else:
            self.counters.traces += 1
            span.trace_id = self._ids.slice_trace_id(pid, tid, index)
            self._slices[(pid, tid)] = (index, span.trace_id)
        span.parent_span_id = 0
        self._sink(span)

    def _split(self, held: _Held) -> None:
        for child in held.children:
            self._emit(child, self._ids.trace_id(child[0].call_id), cut=True)
            self.counters.split += 1
        self.counters.held -= held.count
        held.children = []
        held.count = 0

    def _emit(self, nodes: list[_Node], trace_id: int, *, cut: bool, shared: bool = False) -> bool:
        """Export `nodes` (a subtree, root first) as trace `trace_id`; `shared`: that trace was
        exported to before (the thread's current slice), so it is not counted as a new one.
        False when sampling kept none of them."""
        root = nodes[0]
        keep = None
        if not root.sampled:
            keep = self._interesting(nodes)
            self.counters.sampled_out += len(nodes) - len(keep)
            if not keep:
                return False
        self.counters.root_spans += 1
        if not shared:
            self.counters.traces += 1
        sink = self._sink
        for node in nodes:
            if keep is not None and node.call_id not in keep:
                continue
            span = node.span
            span.trace_id = trace_id
            if node is root:
                if cut:
                    span.attributes = {**span.attributes,
                                       "eacgm.parent.span_id": f"{self._ids.span_id(node.parent_id):016x}"}
                if cut or not node.parent_id:
                    span.parent_span_id = 0
            sink(span)
        return True

    def _interesting(self, nodes: list[_Node]) -> set[int]:
        """Call ids of slow or failed spans and of their ancestors among `nodes`."""
        parent_of = {n.call_id: n.parent_id for n in nodes}
        keep: set[int] = set()
        for n in nodes:
            s = n.span
            if s.end - s.start >= self.slow_ns or s.error is not None:
                cid = n.call_id
                while cid in parent_of and cid not in keep:
                    keep.add(cid)
                    cid = parent_of[cid]
        return keep

