"""The batch span path (records -> OTLP bytes) makes exactly the spans the SDK path made.

tests/fixtures/span_equivalence.json is the decoded OTLP request that the path before issue 25
(one SDK ReadableSpan per call, the SDK's OTLP encoder) made from tests/span_records.py; its
script, tests/fixtures/span_equivalence_old_path.py, says how. Here the same records go
through the agent's record pipeline, shaper and OTLP encoder of today, and the decoded request
must match field by field: every span's ids, parent, name, kind, times, attributes, status,
flags, events and links, its resource and its scope. Order is ignored where OTLP gives it no
meaning (spans within a request, attributes within a span).
"""

from __future__ import annotations

import json
from pathlib import Path

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import span_records as sr

FIXTURE = Path(__file__).parent / "fixtures" / "span_equivalence.json"


def _attributes(message: dict) -> dict:
    """`message` with its attribute list turned into a map (their order means nothing)."""
    if "attributes" in message:
        message["attributes"] = {kv["key"]: kv.get("value", {}) for kv in message["attributes"]}
    return message


def normalize(request: bytes) -> list[dict]:
    """Every span of an encoded ExportTraceServiceRequest with its resource and scope, sorted."""
    req = ExportTraceServiceRequest.FromString(request)
    out = []
    for rs in req.resource_spans:
        resource = _attributes(MessageToDict(rs.resource))
        for ss in rs.scope_spans:
            scope = MessageToDict(ss.scope)
            for span in ss.spans:
                d = _attributes(MessageToDict(span))
                d["status_present"] = span.HasField("status")
                d.update(resource=resource, resource_schema_url=rs.schema_url, scope=scope,
                         scope_schema_url=ss.schema_url)
                out.append(d)
    return sorted(out, key=lambda d: (d["spanId"], d["traceId"]))


def new_path_request() -> bytes:
    """The OTLP request the agent's span path makes from the test records today."""
    from opentelemetry.sdk.resources import Resource

    from otel_eacgm.clock import EpochClock
    from otel_eacgm.decoders import DecodeContext
    from otel_eacgm.kernel_names import KernelNames
    from otel_eacgm.otlp_spans import SpanEncoder
    from otel_eacgm.pipeline import RecordPipeline
    from otel_eacgm.shaping import TraceShaper
    from otel_eacgm.spans import SpanBuilder, SpanIds
    from otel_eacgm.telemetry import Counters

    clock = EpochClock()
    clock.offset_ns = sr.CLOCK_OFFSET_NS
    resources: dict[int, Resource] = {}
    builder = SpanBuilder(sr.rows(), DecodeContext(KernelNames(lambda _pid, addr: sr.KERNEL_STUBS.get(addr))), clock,
                          lambda pid: resources.setdefault(pid, Resource(sr.resource_attributes(pid))),
                          SpanIds(sr.SALT))
    spans: list = []
    shaper = TraceShaper(spans.append, builder.ids, **sr.SHAPER)
    pipeline = RecordPipeline(program=None, builder=builder, shaper=shaper, discovery=None,  # type: ignore[arg-type]
                              call_stats=None, rows=sr.rows(), counters=Counters())
    records = sr.records()
    pipeline.on_batch(records[:7])  # two polls: the batch boundary must not matter
    pipeline.on_batch(records[7:])
    shaper.flush()
    return SpanEncoder().request(spans)


def test_the_batch_path_makes_the_spans_the_sdk_path_made() -> None:
    expected = json.loads(FIXTURE.read_text())
    got = normalize(new_path_request())
    assert len(got) == len(expected) > 20
    for want, have in zip(expected, got):
        assert have == want, f"span {want.get('name')} differs"


def test_the_fixture_covers_every_kind_of_span() -> None:
    """The records exercise what the comparison is for (so it cannot pass on a thin sample)."""
    spans = json.loads(FIXTURE.read_text())
    attrs = set().union(*(s["attributes"] for s in spans))
    assert {"eacgm.parent.span_id", "eacgm.call.incomplete", "eacgm.call.unwound", "error.type",
            "cuda.grid", "nccl.bytes", "code.file.path", "cuda.kernel.name"} <= attrs
    assert {s["resource"]["attributes"]["service.name"]["stringValue"] for s in spans} == {"svc-100", "svc-200"}
    assert any("parentSpanId" in s for s in spans) and any(s["status"].get("code") for s in spans)
