"""CallSpans -> the bytes of an OTLP ExportTraceServiceRequest, written directly.

The SDK's encoder builds a protobuf message per span, per attribute and per value, then
serializes them: most of the agent's CPU per span went there. The agent's spans are all
alike (one scope, INTERNAL, no events or links, a handful of attributes whose keys and most
values repeat), so this writes the protobuf wire format itself from pre-encoded pieces:
each resource and the scope once per process, each (key, value) attribute once while it
repeats, each (name, status) tail once. Decoded, the request is what the SDK's encoder
made from the same spans (tests/test_span_equivalence.py compares them field by field).

Field numbers are those of opentelemetry/proto/trace/v1/trace.proto and common.proto.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_eacgm.spans import SCOPE, CallSpan

_FLAGS = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK: the parent is known to be local (as the SDK sets)
_KIND_INTERNAL = 1
_STATUS_ERROR = 2
_CACHE_MAX = 1 << 16  # resources and span tails kept at most
_VALUES_PER_KEY = 4096  # pre-encoded values kept per attribute key: values that rarely repeat (addresses) stay out
_times = struct.Struct("<BQBQ").pack
_double = struct.Struct("<d").pack


def _varint(n: int) -> bytes:
    """Protobuf base-128 varint; negative ints as their 64-bit two's complement (int64)."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_LENGTHS = [_varint(n) for n in range(1 << 14)]  # length prefixes, looked up
_TAGS = [_varint(n << 3 | 2) for n in range(16)]  # tags of length-delimited fields 0..15


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    size = len(payload)
    return b"".join((_TAGS[number], _LENGTHS[size] if size < 16384 else _varint(size), payload))


def _any_value(value: object) -> bytes:
    """An AnyValue message's bytes, as the SDK's _encode_value chooses the variant."""
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, str):
        return _field(1, value.encode())
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _double(value)
    if isinstance(value, bytes):
        return _field(7, value)
    if isinstance(value, (list, tuple)):
        return _field(5, b"".join(_field(1, _any_value(v)) for v in value))
    raise TypeError(f"attribute value {value!r} of type {type(value).__name__} cannot be encoded")


def key_value(key: str, value: object) -> bytes:
    """A KeyValue message's bytes."""
    return _field(1, key.encode()) + _field(2, _any_value(value))


def _attributes(number: int, attributes: dict) -> bytes:
    return b"".join(_field(number, key_value(k, v)) for k, v in attributes.items())


def resource_message(resource: Resource) -> bytes:
    """A Resource message's bytes."""
    return _attributes(1, dict(resource.attributes))


def scope_message(scope: InstrumentationScope) -> bytes:
    """An InstrumentationScope message's bytes."""
    out = _field(1, scope.name.encode())
    if scope.version:
        out += _field(2, scope.version.encode())
    return out + _attributes(3, dict(scope.attributes or {}))


class SpanEncoder:
    """Encodes batches of CallSpans; keeps the pre-encoded pieces between batches."""

    def __init__(self, scope: InstrumentationScope = SCOPE) -> None:
        self._scope = _field(1, scope_message(scope))
        self._schema = _field(3, scope.schema_url.encode()) if scope.schema_url else b""
        self._resources: dict[int, tuple[Resource, bytes]] = {}
        self._attrs: dict[str, dict[object, bytes]] = {}  # key -> value -> the KeyValue field
        self._keys: dict[str, bytes] = {}  # key -> its encoded KeyValue.key field
        self._tails: dict[tuple[str, str | None], bytes] = {}
        self._fixed: dict[int, tuple[dict, bytes]] = {}  # id(CallSpan.fixed) -> it, its attribute fields

    def _fixed_attributes(self, fixed: dict) -> bytes:
        """The attribute fields of a CallSpan.fixed dict, encoded once per dict."""
        if len(self._fixed) >= _CACHE_MAX:
            self._fixed.clear()
        encoded = _attributes(9, fixed)
        self._fixed[id(fixed)] = (fixed, encoded)  # holding the dict keeps its id from being reused
        return encoded

    def _resource(self, resource: Resource) -> bytes:
        """ResourceSpans' resource field (and schema URL) of `resource`, encoded once."""
        known = self._resources.get(id(resource))
        if known is None or known[0] is not resource:
            schema = _field(3, resource.schema_url.encode()) if resource.schema_url else b""
            known = self._resources[id(resource)] = (resource, _field(1, resource_message(resource)) + schema)
            if len(self._resources) > _CACHE_MAX:  # processes come and go: start again
                self._resources = {id(resource): known}
        return known[1]

    def _tail(self, name: str, error: str | None) -> bytes:
        """Name, kind, status and flags of a span: the same for every call of one function."""
        tail = _field(5, name.encode()) + bytes((6 << 3, _KIND_INTERNAL))
        status = b"" if error is None else _field(2, error.encode()) + bytes((3 << 3, _STATUS_ERROR))
        tail += _field(15, status) + b"\x85\x01" + struct.pack("<I", _FLAGS)  # 15: status, 16 (fixed32): flags
        if len(self._tails) > _CACHE_MAX:
            self._tails.clear()
        self._tails[(name, error)] = tail
        return tail

    def _attribute(self, key: str, value: object, values: dict[object, bytes] | None) -> bytes:
        """Span.attributes field of one attribute not pre-encoded; kept for next time while the
        key's values repeat (at most _VALUES_PER_KEY of them)."""
        prefix = self._keys.get(key)
        if prefix is None:
            prefix = self._keys[key] = _field(1, key.encode())
        kind = type(value)
        text = value.encode() if kind is str else b""  # type: ignore[attr-defined]
        n = len(text)
        if kind is str and n < 126 and len(prefix) < 8000:  # both inner lengths are one varint byte
            encoded = b"".join((b"\x4a", _LENGTHS[len(prefix) + n + 4], prefix, b"\x12", _LENGTHS[n + 2], b"\x0a",
                                _LENGTHS[n], text))
        else:
            encoded = _field(9, prefix + _field(2, _any_value(value)))
        if kind is str or kind is int or kind is float:
            if values is None:
                values = self._attrs[key] = {}
            if len(values) < _VALUES_PER_KEY:
                values[value] = encoded
        return encoded

    def span(self, s: CallSpan) -> bytes:
        """One Span message, with its ScopeSpans.spans field header."""
        cache, attribute = self._attrs, self._attribute
        attrs = b"".join([(values.get(v) if (values := cache.get(k)) else None) or attribute(k, v, values)
                          for k, v in s.attributes.items()])  # lists and bools are never cached: no lookup by them
        fixed = s.fixed
        if fixed is not None:
            known = self._fixed.get(id(fixed))
            attrs += known[1] if known is not None and known[0] is fixed else self._fixed_attributes(fixed)
        body = b"".join((
            b"\x0a\x10", s.trace_id.to_bytes(16, "big"), b"\x12\x08", s.span_id.to_bytes(8, "big"),
            b"\x22\x08" + s.parent_span_id.to_bytes(8, "big") if s.parent_span_id else b"",
            self._tails.get((s.name, s.error)) or self._tail(s.name, s.error),
            _times(0x39, s.start, 0x41, s.end),  # 7, 8: start and end, fixed64
            attrs))
        size = len(body)
        return b"".join((b"\x12", _LENGTHS[size] if size < 16384 else _varint(size), body))

    def request(self, spans: Sequence[CallSpan]) -> bytes:
        """The ExportTraceServiceRequest of `spans`: one ResourceSpans per resource, one scope."""
        by_resource: dict[int, list[bytes]] = {}
        resources: dict[int, Resource] = {}
        span = self.span
        for s in spans:
            rid = id(s.resource)
            group = by_resource.get(rid)
            if group is None:
                group = by_resource[rid] = []
                resources[rid] = s.resource
            group.append(span(s))
        out = []
        for rid, encoded in by_resource.items():
            scope_spans = _field(2, self._scope + b"".join(encoded) + self._schema)
            out.append(_field(1, self._resource(resources[rid]) + scope_spans))
        return b"".join(out)
