"""Call records -> spans, streaming (no buffering until a parent returns), in batches.

Span, parent and trace ids are derived from the kernel's call ids, so a child can be exported
before its parent returns and still point at it: span id = mix(call_id), parent = mix(parent
call_id), trace id = mix(root call id), all salted per agent run so two agent runs never reuse
ids. A span is a `CallSpan`: the few fields OTLP needs, no SDK Span object (otlp_spans.py
encodes them straight to OTLP bytes); the ids of a batch of calls are mixed in one numpy pass.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import numpy as np
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_eacgm import __version__
from otel_eacgm.clock import EpochClock
from otel_eacgm.cuda_enums import CUDA_DRIVER_ERRORS, CUDA_RUNTIME_ERRORS, NCCL_RESULTS, error_name
from otel_eacgm.decoders import DECODERS, DecodeContext
from otel_eacgm.events import PY_PROBE_ID, Call, CallFlags
from otel_eacgm.probes.catalog import Family, Layer, ProbeSpec
from otel_eacgm.python_names import PythonNames

SCOPE = InstrumentationScope("otel-eacgm", __version__)
_MASK64 = (1 << 64) - 1

_ERRORS: dict[Family, tuple[dict[int, str], str]] = {
    Family.CUDART: (CUDA_RUNTIME_ERRORS, "cudaError"),
    Family.CUDA: (CUDA_DRIVER_ERRORS, "CUDA_ERROR_"),
    Family.NCCL: (NCCL_RESULTS, "ncclResult"),
}


def error_type(spec: ProbeSpec, code: int) -> str:
    """`error.type` of a call of `spec` that returned the nonzero status `code`."""
    table, prefix = _ERRORS[spec.family]
    return error_name(table, _signed32(code), prefix)


def _error(errors: dict[int, tuple[str, str]], spec: ProbeSpec, code: int) -> tuple[str, str]:
    """(error.type, status message) of a failed call, made once per probe and return code."""
    known = errors.get(code)
    if known is None:
        name = error_type(spec, code)
        known = errors[code] = (name, f"{spec.symbol} returned {name} ({code})")
    return known


def _mix64(x: int) -> int:
    """splitmix64 finalizer: a bijection, so distinct call ids give distinct span ids."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) or 1


_U64 = np.uint64


def _mix64_array(x: np.ndarray) -> np.ndarray:
    """_mix64 of every element (uint64 arithmetic wraps as the masks above do)."""
    with np.errstate(over="ignore"):
        x = x + _U64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
        x = x ^ (x >> _U64(31))
    x[x == 0] = 1
    return x


def _signed32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


_INCOMPLETE = int(CallFlags.INCOMPLETE)
_UNWOUND = int(CallFlags.UNWOUND)
_RETURNED = int(CallFlags.RETURNED)


def _ended_early(flags: int, attrs: dict, name: str) -> str | None:
    """The error description of a call that did not return (its thread died, or an exception left it)."""
    if flags & _INCOMPLETE:
        attrs["eacgm.call.incomplete"] = True
        attrs["error.type"] = "eacgm.thread_exited"
        return "the thread exited before the call returned"
    if flags & _UNWOUND:
        # a C++ exception left the call; it ended at the latest when the thread went on
        attrs["eacgm.call.unwound"] = True
        attrs["error.type"] = "eacgm.exception"
        return f"{name} ended by an exception"
    return None


class CallSpan:
    """One span as OTLP carries it: ids, name, times, attributes, status, resource.

    Every span the agent makes is INTERNAL, has no events or links and one scope (SCOPE);
    `error` is the status description of a failed call (status ERROR), None for UNSET. The
    trace shaper sets `trace_id` (and cuts `parent_span_id`) before export. `fixed`: more
    attributes, a dict shared by the spans of one row, thread and outcome (never modified, no
    key of `attributes`), so that it is built and encoded once; `all_attributes()` has both.
    """

    __slots__ = ("name", "span_id", "parent_span_id", "trace_id", "start", "end", "attributes", "error", "resource",
                 "fixed")

    def __init__(self, name: str, span_id: int, parent_span_id: int, start: int, end: int, attributes: dict,
                 error: str | None, resource: Resource, trace_id: int = 0, fixed: dict | None = None) -> None:
        self.name = name
        self.span_id = span_id
        self.parent_span_id = parent_span_id
        self.trace_id = trace_id
        self.start = start
        self.end = end
        self.attributes = attributes
        self.error = error
        self.resource = resource
        self.fixed = fixed

    def all_attributes(self) -> dict:
        """Every attribute of the span."""
        return {**self.fixed, **self.attributes} if self.fixed else self.attributes

    def __repr__(self) -> str:
        return f"CallSpan({self.name!r}, span {self.span_id:016x}, parent {self.parent_span_id:016x})"


class SpanIds:
    """Deterministic ids for one agent run."""

    def __init__(self, salt: int | None = None) -> None:
        self.salt = salt if salt is not None else int.from_bytes(os.urandom(8), "little")

    def span_id(self, call_id: int) -> int:
        """64-bit span id of a call."""
        return _mix64(call_id ^ self.salt)

    def trace_id(self, root_id: int) -> int:
        """128-bit trace id of the outermost call's tree."""
        return (_mix64(self.salt) << 64) | _mix64(root_id ^ ~self.salt & _MASK64)

    def slice_trace_id(self, pid: int, tid: int, slice_index: int) -> int:
        """128-bit trace id shared by one thread's outermost leaf calls in one time slice."""
        key = _mix64((pid << 32 | tid) ^ self.salt) ^ slice_index
        return (_mix64(~self.salt & _MASK64) << 64) | _mix64(key)

    def span_ids(self, call_ids: np.ndarray) -> list[int]:
        """span_id of each call id of a batch (uint64 array); 0 for call id 0 (no parent)."""
        out = _mix64_array(call_ids ^ _U64(self.salt))
        out[call_ids == 0] = 0
        return out.tolist()


_Probe = tuple[ProbeSpec, Callable[..., dict], bool, dict[str, object], dict[int, tuple[str, str]], frozenset[str],
               dict[tuple[int, int, int | None], tuple[dict[str, object], str | None]]]
"""A row's spec, decoder function, whether it takes the symbol, its constant attributes, its error
names by code, the keys a decoder's own must not have for CallSpan.fixed, the fixed attributes
and status by (pid, tid, return code)."""
_PER_CALL = frozenset(("process.pid", "thread.id", "eacgm.call.return_code", "error.type", "eacgm.python.line",
                       "eacgm.call.incomplete", "eacgm.call.unwound"))
_SHARED_MAX = 4096  # (pid, tid, return code) sets kept per row


class SpanBuilder:
    """Builds one CallSpan per call record."""

    def __init__(self, rows: Mapping[int, ProbeSpec], decode_ctx: DecodeContext, clock: EpochClock,
                 resource_for: Callable[[int], Resource], ids: SpanIds | None = None) -> None:
        self._rows = rows
        self._ctx = decode_ctx
        self._clock = clock
        self._resource_for = resource_for
        self.ids = ids or SpanIds()
        self.python_names = PythonNames()
        self._probes: dict[int, _Probe] = {}

    def _probe(self, probe_id: int) -> _Probe:
        """A catalog row's decoder and the attributes every call of it has, looked up once
        (and its error names, as they come). Raises KeyError for a probe id outside the catalog."""
        spec = self._rows[probe_id]
        decoder = DECODERS[spec.decoder]
        static = {**dict(spec.attributes), "eacgm.layer": spec.layer.value, "code.function.name": spec.symbol}
        reserved = frozenset(static) | _PER_CALL
        probe = self._probes[probe_id] = (spec, decoder.decode, decoder.symbol_aware, static, {}, reserved, {})
        return probe

    def _shared(self, probe: _Probe, key: tuple[int, int, int | None]) -> tuple[dict[str, object], str | None]:
        """The fixed attributes and status of a row's calls on one thread with one return code."""
        spec, _decode, _aware, static, errors, _reserved, shared = probe
        pid, tid, code = key
        fixed: dict[str, object] = {**static, "process.pid": pid, "thread.id": tid}
        error = None
        if code is not None:
            fixed["eacgm.call.return_code"] = code
            if code != 0:
                fixed["error.type"], error = _error(errors, spec, code)
        if len(shared) >= _SHARED_MAX:
            shared.clear()
        shared[key] = (fixed, error)
        return shared[key]

    def build(self, ev: Call, span_id: int, parent_span_id: int, string: bytes | None = None,
              python_line: int | None = None) -> CallSpan:
        """The span of one call record (a Python call whose names never came too: a frame left
        by a dead thread); `python_line`: the line of the Python frame that made the call.
        Raises KeyError for a probe id outside the catalog."""
        if ev.probe_id == PY_PROBE_ID:
            return self.build_python(ev, span_id, parent_span_id, None, None)
        probe = self._probes.get(ev.probe_id)
        if probe is None or probe[0] is not self._rows.get(ev.probe_id):  # new, or its slot taken by another row
            probe = self._probe(ev.probe_id)
        spec, decode, symbol_aware, static, errors, reserved, shared = probe
        attrs = decode(ev, string, self._ctx, symbol=spec.symbol) if symbol_aware else decode(ev, string, self._ctx)
        flags = ev.flags
        if python_line is None and not flags & (_INCOMPLETE | _UNWOUND) and reserved.isdisjoint(attrs):
            # the common case: all but the decoded arguments is the same for this row's calls
            # on one thread with one outcome: one shared dict (CallSpan.fixed)
            code = None
            if flags & _RETURNED and spec.returns_status:
                code = ev.ret & 0xFFFFFFFF  # _signed32, inline
                if code & 0x80000000:
                    code -= 1 << 32
            key = (ev.pid, ev.tid, code)
            fixed = shared.get(key) or self._shared(probe, key)
            offset = self._clock.offset_ns
            return CallSpan(spec.symbol, span_id, parent_span_id, ev.entry_ns + offset, ev.exit_ns + offset, attrs,
                            fixed[1], self._resource_for(ev.pid), fixed=fixed[0])
        attrs.update(static)
        attrs["process.pid"] = ev.pid
        attrs["thread.id"] = ev.tid
        if python_line is not None:
            attrs["eacgm.python.line"] = python_line
        error = _ended_early(flags, attrs, spec.symbol) if flags & (_INCOMPLETE | _UNWOUND) else None
        if error is None and flags & _RETURNED and spec.returns_status:
            code = _signed32(ev.ret)
            attrs["eacgm.call.return_code"] = code
            if code != 0:
                attrs["error.type"], error = _error(errors, spec, code)
        offset = self._clock.offset_ns
        return CallSpan(spec.symbol, span_id, parent_span_id, ev.entry_ns + offset, ev.exit_ns + offset, attrs,
                        error, self._resource_for(ev.pid))

    def build_python(self, ev: Call, span_id: int, parent_span_id: int, func: bytes | None,
                     file: bytes | None) -> CallSpan:
        """The span of one Python function call (names None: a frame left by a dead thread)."""
        function = (func or b"").decode(errors="replace") or "<unknown>"
        path = (file or b"").decode(errors="replace")
        line = _signed32(ev.args[2])
        qualname, qualified = self.python_names.names(ev.pid, path, function, line)
        attrs: dict[str, object] = {
            "eacgm.layer": Layer.PYTHON.value,
            "code.function.name": qualified,
            "code.file.path": path,
            "code.line.number": line,
            "process.pid": ev.pid,
            "thread.id": ev.tid,
        }
        error = _ended_early(ev.flags, attrs, qualname)
        offset = self._clock.offset_ns
        return CallSpan(qualname, span_id, parent_span_id, ev.entry_ns + offset, ev.exit_ns + offset, attrs, error,
                        self._resource_for(ev.pid))
