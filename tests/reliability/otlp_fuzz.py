"""Hostile OTLP requests for the detector's gRPC endpoints, from a seeded generator.

Seeded `random` rather than hypothesis: the suite sends ten thousand cases over real gRPC in
seconds, and a failing case is reproduced from (seed, index), which every failure message names.
Each generator returns (category, service, payload bytes).
"""

from __future__ import annotations

import math
import random
import struct
import time

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

SERVICES = {
    "traces": "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    "metrics": "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    "logs": "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
}
_EXTREME_TIMES = [0, 1, 2**31, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
_EXTREME_INTS = [0, -1, 2**63 - 1, -(2**63), 1]
_EXTREME_FLOATS = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324]


def _now_ns() -> int:
    return time.time_ns() - 3600 * 10**9


def _text(rng: random.Random) -> str:
    pick = rng.random()
    if pick < 0.6:
        return rng.choice(["cudaLaunchKernel", "ncclAllReduce", "aten::addmm", "host.name", "process.pid", "node0"])
    if pick < 0.8:
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0xD7FF)]))
                       for _ in range(rng.randrange(0, 40)))
    return rng.choice(["", "\0", "x" * rng.randrange(1000, 20000), "\u202e", "eacgm.layer"])


def _any_value(rng: random.Random, depth: int = 0) -> AnyValue:
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return AnyValue(string_value=_text(rng))
    if kind == 1:
        return AnyValue(int_value=rng.choice(_EXTREME_INTS + [rng.randrange(-10**6, 10**6)]))
    if kind == 2:
        return AnyValue(double_value=rng.choice(_EXTREME_FLOATS + [rng.random()]))
    if kind == 3:
        return AnyValue(bool_value=rng.random() < 0.5)
    if kind == 4:
        return AnyValue(bytes_value=rng.randbytes(rng.randrange(0, 64)))
    if kind in (5, 6):
        v = AnyValue()
        v.array_value.values.extend(_any_value(rng, depth + 1) for _ in range(rng.randrange(0, 5)))
        return v
    v = AnyValue()
    v.kvlist_value.values.extend(KeyValue(key=_text(rng), value=_any_value(rng, depth + 1))
                                 for _ in range(rng.randrange(0, 5)))
    return v


def _attributes(rng: random.Random, hostile: bool) -> list[KeyValue]:
    out = [KeyValue(key="host.name", value=AnyValue(string_value=f"fuzz{rng.randrange(4)}"))]
    out.append(KeyValue(key="process.pid", value=AnyValue(int_value=rng.randrange(1, 6))))
    if hostile:
        out.extend(KeyValue(key=_text(rng), value=_any_value(rng)) for _ in range(rng.randrange(0, 6)))
        if rng.random() < 0.2:  # an entity attribute of the wrong type
            out.append(KeyValue(key=rng.choice(["host.name", "process.pid", "eacgm.rank"]), value=_any_value(rng)))
    return out


def traces(rng: random.Random, hostile: bool = False, spans: int | None = None) -> ExportTraceServiceRequest:
    """A trace request; hostile: extreme times, bad ids, odd attribute values."""
    req = ExportTraceServiceRequest()
    for _ in range(rng.randrange(1, 3)):
        rs = req.resource_spans.add()
        rs.resource.attributes.extend(_attributes(rng, hostile))
        ss = rs.scope_spans.add()
        ss.scope.name = "otel-eacgm"
        for _ in range(spans if spans is not None else rng.randrange(1, 20)):
            start = _now_ns() + rng.randrange(0, 10**10)
            end = start + rng.randrange(0, 10**7)
            if hostile and rng.random() < 0.5:
                start, end = rng.choice(_EXTREME_TIMES), rng.choice(_EXTREME_TIMES)
            tid = rng.randbytes(rng.choice([16, 16, 0, 8, 17]) if hostile else 16)
            sid = rng.randbytes(rng.choice([8, 8, 0, 4, 9]) if hostile else 8)
            sp = ss.spans.add(name=_text(rng) if hostile else "cudaLaunchKernel", trace_id=tid, span_id=sid,
                              start_time_unix_nano=start, end_time_unix_nano=end,
                              kind=rng.randrange(0, 6))
            sp.attributes.extend([KeyValue(key="eacgm.layer", value=AnyValue(string_value="cuda.runtime")),
                                  KeyValue(key="code.function.name", value=AnyValue(string_value="cudaLaunchKernel"))])
            if hostile:
                sp.attributes.extend(KeyValue(key=rng.choice(["nccl.bytes", "eacgm.layer", _text(rng)]),
                                              value=_any_value(rng)) for _ in range(rng.randrange(0, 4)))
                sp.status.code = rng.randrange(0, 3)
    return req


def metrics(rng: random.Random, hostile: bool = False) -> ExportMetricsServiceRequest:
    """A metrics request with gauges, sums, histograms, summaries; hostile: NaN, extremes."""
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.extend(_attributes(rng, hostile))
    sm = rm.scope_metrics.add()
    for _ in range(rng.randrange(1, 8)):
        m = sm.metrics.add(name=_text(rng) if hostile else rng.choice(["hw.gpu.utilization", "system.network.io"]))
        t = rng.choice(_EXTREME_TIMES) if hostile and rng.random() < 0.4 else _now_ns() + rng.randrange(0, 10**10)
        value = rng.choice(_EXTREME_FLOATS) if hostile and rng.random() < 0.4 else rng.random()
        kind = rng.randrange(4)
        if kind == 0:
            m.gauge.data_points.add(time_unix_nano=t, as_double=value)
        elif kind == 1:
            m.sum.is_monotonic = rng.random() < 0.7
            m.sum.aggregation_temporality = rng.randrange(0, 3)
            dp = m.sum.data_points.add(time_unix_nano=t)
            if rng.random() < 0.5:
                dp.as_int = rng.choice(_EXTREME_INTS)
            else:
                dp.as_double = value
        elif kind == 2:
            m.histogram.aggregation_temporality = rng.randrange(0, 3)
            m.histogram.data_points.add(time_unix_nano=t, count=rng.choice([0, 1, 2**64 - 1]), sum=value,
                                        bucket_counts=[1, 2], explicit_bounds=[value])
        else:
            m.summary.data_points.add(time_unix_nano=t, count=rng.choice([0, 3, 2**64 - 1]), sum=value)
    return req


def logs(rng: random.Random, hostile: bool = False) -> ExportLogsServiceRequest:
    """A logs request; hostile: extreme times, odd severities and bodies."""
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.extend(_attributes(rng, hostile))
    sl = rl.scope_logs.add()
    for _ in range(rng.randrange(1, 10)):
        t = rng.choice(_EXTREME_TIMES) if hostile and rng.random() < 0.4 else _now_ns()
        rec = sl.log_records.add(time_unix_nano=t, severity_number=rng.randrange(0, 25),
                                 severity_text=_text(rng) if hostile else "ERROR")
        rec.body.CopyFrom(_any_value(rng) if hostile else AnyValue(string_value="boom"))
    return req


_VALID = {"traces": traces, "metrics": metrics, "logs": logs}


def _mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randrange(1, 9)):
        op = rng.randrange(6)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:  # flip a bit
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:  # replace a byte with a boundary value
            buf[rng.randrange(len(buf))] = rng.choice([0x00, 0x7F, 0x80, 0xFF, 0x0A, 0x12])
        elif op == 2:  # insert random bytes
            buf[pos:pos] = rng.randbytes(rng.randrange(1, 16))
        elif op == 3 and buf:  # delete a range
            del buf[pos:pos + rng.randrange(1, 32)]
        elif op == 4:  # truncate
            del buf[pos:]
        else:  # duplicate a chunk (repeated fields, overlapping lengths)
            chunk = bytes(buf[pos:pos + rng.randrange(1, 64)])
            buf[pos:pos] = chunk * rng.randrange(1, 4)
    return bytes(buf)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _wrong_wire_types(rng: random.Random) -> bytes:
    """Field numbers of the requests with other wire types, bogus lengths and varints."""
    field = rng.choice([1, 2, 3, 15, 2**29 - 1])
    wire = rng.choice([0, 1, 3, 4, 5, 6, 7])
    body = {0: _varint(rng.randrange(2**64)), 1: struct.pack("<d", rng.random()), 5: b"\0\0\0\0"}.get(wire, b"")
    head = _varint(field << 3 | wire)
    if rng.random() < 0.3:  # length-delimited, length far beyond the payload
        head, body = _varint(field << 3 | 2), _varint(rng.choice([2**31, 2**63, 5])) + b"ab"
    if rng.random() < 0.2:  # an unterminated varint
        body = b"\xff" * rng.randrange(1, 12)
    return head + body


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _deep_value(depth: int) -> bytes:
    """A trace request whose resource attribute nests `depth` arrays, encoded by hand (the
    protobuf library itself refuses to build messages deeper than its limit)."""
    value = AnyValue(string_value="leaf").SerializeToString()
    for _ in range(depth):
        value = _field(5, _field(1, value))  # AnyValue.array_value -> ArrayValue.values
    attribute = _field(1, b"deep") + _field(2, value)  # KeyValue.key, KeyValue.value
    return _field(1, _field(1, _field(1, attribute)))  # request.resource_spans.resource.attributes


def case(rng: random.Random, category: str) -> tuple[str, bytes]:
    """One case of `category`: (service, payload)."""
    service = rng.choice(list(SERVICES))
    if category == "random_bytes":
        return service, rng.randbytes(rng.choice([0, 1, 2, 7, 64, 512, 4096]))
    if category == "mutated":
        return service, _mutate(rng, _VALID[service](rng).SerializeToString())
    if category == "hostile_values":
        return service, _VALID[service](rng, hostile=True).SerializeToString()
    if category == "wrong_message":
        other = rng.choice([s for s in SERVICES if s != service])
        if rng.random() < 0.3:
            span = Span(name="x", trace_id=rng.randbytes(16), span_id=rng.randbytes(8), start_time_unix_nano=1)
            return service, span.SerializeToString()
        if rng.random() < 0.5:
            return service, _VALID[other](rng).SerializeToString()
        return service, _wrong_wire_types(rng)
    if category == "attribute_flood":
        req = traces(rng, spans=rng.choice([1, 100]))
        n = rng.choice([1000, 10000, 50000])
        target = req.resource_spans[0].resource.attributes if rng.random() < 0.5 \
            else req.resource_spans[0].scope_spans[0].spans[0].attributes
        target.extend(KeyValue(key=f"k{i}", value=AnyValue(string_value="v" * rng.randrange(1, 20))) for i in range(n))
        return "traces", req.SerializeToString()
    if category == "deep_nesting":
        return "traces", _deep_value(rng.choice([10, 50, 99, 101, 200, 1000]))
    raise ValueError(f"unknown fuzz category {category!r}")


def huge_batch(spans: int, seed: int = 0) -> bytes:
    """One trace request of `spans` plain spans (serialized)."""
    return traces(random.Random(seed), spans=spans).SerializeToString()
