"""Call records -> OpenTelemetry spans, streaming (no buffering until a parent returns).

Span, parent and trace ids are derived from the kernel's call ids, so a child can be exported
before its parent returns and still point at it: span id = mix(call_id), parent = mix(parent
call_id), trace id = mix(root call id), all salted per agent run so two agent runs never reuse
ids.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from otel_eacgm import __version__
from otel_eacgm.clock import EpochClock
from otel_eacgm.cuda_enums import CUDA_DRIVER_ERRORS, CUDA_RUNTIME_ERRORS, NCCL_RESULTS, error_name
from otel_eacgm.decoders import DECODERS, DecodeContext
from otel_eacgm.events import PY_PROBE_ID, CallEvent, CallFlags
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


def _mix64(x: int) -> int:
    """splitmix64 finalizer: a bijection, so distinct call ids give distinct span ids."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) or 1


def _signed32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def _ended_early(ev: CallEvent, attrs: dict, name: str) -> Status | None:
    """The error status of a call that did not return (its thread died, or an exception left it)."""
    if ev.flags & CallFlags.INCOMPLETE:
        attrs["eacgm.call.incomplete"] = True
        attrs["error.type"] = "eacgm.thread_exited"
        return Status(StatusCode.ERROR, "the thread exited before the call returned")
    if ev.flags & CallFlags.UNWOUND:
        # a C++ exception left the call; it ended at the latest when the thread went on
        attrs["eacgm.call.unwound"] = True
        attrs["error.type"] = "eacgm.exception"
        return Status(StatusCode.ERROR, f"{name} ended by an exception")
    return None


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

    def context(self, call_id: int, root_id: int) -> SpanContext:
        """SpanContext of a call."""
        return SpanContext(self.trace_id(root_id), self.span_id(call_id), is_remote=False,
                           trace_flags=TraceFlags(TraceFlags.SAMPLED))


class SpanBuilder:
    """Builds one ReadableSpan per call record."""

    def __init__(self, rows: Mapping[int, ProbeSpec], decode_ctx: DecodeContext, clock: EpochClock,
                 resource_for: Callable[[int], Resource], ids: SpanIds | None = None) -> None:
        self._rows = rows
        self._ctx = decode_ctx
        self._clock = clock
        self._resource_for = resource_for
        self.ids = ids or SpanIds()
        self.python_names = PythonNames()

    def build(self, ev: CallEvent, string: bytes | None = None, python_line: int | None = None) -> ReadableSpan:
        """The span of one call record (a Python call whose names never came too: a frame left
        by a dead thread); `python_line`: the line of the Python frame that made the call.
        Raises KeyError for a probe id outside the catalog."""
        if ev.probe_id == PY_PROBE_ID:
            return self.build_python(ev, None, None)
        spec = self._rows[ev.probe_id]
        decoder = DECODERS[spec.decoder]
        if decoder.symbol_aware:
            attrs = decoder.decode(ev, string, self._ctx, symbol=spec.symbol)
        else:
            attrs = decoder.decode(ev, string, self._ctx)
        attrs.update(spec.attributes)
        attrs.update({
            "eacgm.layer": spec.layer.value,
            "code.function.name": spec.symbol,
            "process.pid": ev.pid,
            "thread.id": ev.tid,
        })
        if python_line is not None:
            attrs["eacgm.python.line"] = python_line
        status = _ended_early(ev, attrs, spec.symbol)
        if status is None and ev.flags & CallFlags.RETURNED and spec.returns_status:
            code = _signed32(ev.ret)
            attrs["eacgm.call.return_code"] = code
            if code != 0:
                name = error_type(spec, code)
                attrs["error.type"] = name
                status = Status(StatusCode.ERROR, f"{spec.symbol} returned {name} ({code})")
        return self._span(spec.symbol, ev, attrs, status)

    def build_python(self, ev: CallEvent, func: bytes | None, file: bytes | None) -> ReadableSpan:
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
        return self._span(qualname, ev, attrs, _ended_early(ev, attrs, qualname))

    def _span(self, name: str, ev: CallEvent, attrs: dict, status: Status | None) -> ReadableSpan:
        parent = self.ids.context(ev.parent_id, ev.root_id) if ev.parent_id else None
        return ReadableSpan(
            name=name,
            context=self.ids.context(ev.call_id, ev.root_id),
            parent=parent,
            resource=self._resource_for(ev.pid),
            attributes=attrs,
            kind=SpanKind.INTERNAL,
            status=status or Status(StatusCode.UNSET),
            start_time=self._clock.to_epoch(ev.entry_ns),
            end_time=self._clock.to_epoch(ev.exit_ns),
            instrumentation_scope=SCOPE,
        )
