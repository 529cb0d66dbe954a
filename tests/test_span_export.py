"""Spans sent as ready OTLP bytes still honour the SDK exporters' settings and retries.

Real gRPC and HTTP servers here receive what export.span_exporter sends: the
OTEL_EXPORTER_OTLP_HEADERS reach them, gzip compression is applied when asked, a transient
UNAVAILABLE is retried, and the body decodes to the spans that were queued.
"""

from __future__ import annotations

import gzip
import http.server
import threading
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_eacgm.export import span_exporter
from otel_eacgm.spans import CallSpan


def _spans() -> list[CallSpan]:
    res = Resource({"service.name": "svc"})
    return [CallSpan(f"call{i}", i + 1, 0, 10, 20, {"n": i}, None, res, trace_id=99) for i in range(3)]


def _names(body: bytes) -> list[str]:
    req = ExportTraceServiceRequest.FromString(body)
    return [s.name for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]


def test_grpc_sends_the_headers_and_retries_an_unavailable_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[dict, bytes]] = []

    def export(request: bytes, context: grpc.ServicerContext) -> bytes:
        seen.append((dict(context.invocation_metadata()), request))
        if len(seen) == 1:
            context.abort(grpc.StatusCode.UNAVAILABLE, "starting up")
        return ExportTraceServiceResponse().SerializeToString()

    handler = grpc.method_handlers_generic_handler("opentelemetry.proto.collector.trace.v1.TraceService", {
        "Export": grpc.unary_unary_rpc_method_handler(export)})  # raw bytes in and out
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=team-a")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
        sink = span_exporter("grpc", f"http://127.0.0.1:{port}", True, 10)
        assert sink.export(_spans()) is SpanExportResult.SUCCESS
        sink.shutdown()
    finally:
        server.stop(0)
    assert len(seen) == 2  # the first answer was UNAVAILABLE: retried
    metadata, body = seen[-1]
    assert metadata.get("x-tenant") == "team-a"
    assert _names(body) == ["call0", "call1", "call2"]


def test_http_posts_gzip_with_the_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, dict, bytes]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the handler's naming
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.path, dict(self.headers), body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()
            self.wfile.write(ExportTraceServiceResponse().SerializeToString())

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=team-b")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
        sink = span_exporter("http/protobuf", f"http://127.0.0.1:{server.server_address[1]}", None, 10)
        assert sink.export(_spans()) is SpanExportResult.SUCCESS
        sink.shutdown()
    finally:
        server.shutdown()
    path, headers, body = seen[-1]
    assert path == "/v1/traces" and headers.get("x-tenant") == "team-b"
    assert headers.get("Content-Encoding") == "gzip"
    assert _names(gzip.decompress(body)) == ["call0", "call1", "call2"]
