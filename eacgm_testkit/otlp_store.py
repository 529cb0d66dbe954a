"""An in-process OTLP gRPC receiver that keeps what it receives, to be queried.

The end of the real pipeline (agent -> real Collector -> this store) where a backend would be:
the demo's live summary reads it, and so do the tests (the contrib file exporter cannot be built
from the Go proxy here). Memory grows with what it receives: for demos, tests and benchmarks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def any_value(v: AnyValue) -> object:
    """Python value of an OTLP AnyValue."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def attrs(kvs) -> dict[str, object]:  # noqa: ANN001 - repeated KeyValue
    """Dict of an OTLP attribute list."""
    return {kv.key: any_value(kv.value) for kv in kvs}


class Store(trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer,
            logs_service_pb2_grpc.LogsServiceServicer):
    """Servicer for the three OTLP services plus query helpers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.logs: list[logs_service_pb2.ExportLogsServiceRequest] = []
        # What the query helpers made of the requests so far, per signal: (the list read, how
        # many of its requests, their dicts)
        self._read_lock = threading.Lock()
        self._read: dict[str, tuple[list | None, int, list[dict]]] = {}

    def Export(self, request, context):  # noqa: N802, ANN001, ANN201 - gRPC naming
        with self._lock:
            if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
                self.traces.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()
            if isinstance(request, metrics_service_pb2.ExportMetricsServiceRequest):
                self.metrics.append(request)
                return metrics_service_pb2.ExportMetricsServiceResponse()
            self.logs.append(request)
            return logs_service_pb2.ExportLogsServiceResponse()

    def _converted(self, signal: str, requests: list, convert: Callable[[Any], list[dict]]) -> list[dict]:
        """Every request of a signal as dicts, each request converted once. A session's store
        holds hundreds of thousands of spans and tests poll it every 0.1 s: converting all of
        them each time made the suite CPU-bound. The Export lock is held only to copy the new
        requests: an Export kept waiting past the Collector's timeout is retried, which would
        store it twice."""
        with self._read_lock:
            seen, done, out = self._read.get(signal, (None, 0, []))
            with self._lock:
                if seen is not requests or len(requests) < done:  # a benchmark emptied or replaced it
                    done, out = 0, []
                new = requests[done:]
            for req in new:
                out.extend(convert(req))
            self._read[signal] = (requests, done + len(new), out)
            return list(out)

    def spans(self) -> list[dict]:
        """Every received span as a dict with its resource attributes."""
        return self._converted("traces", self.traces, _span_dicts)

    def metric_points(self) -> list[dict]:
        """Every received metric data point as {name, resource, attributes, value}."""
        return self._converted("metrics", self.metrics, _point_dicts)

    def log_records(self) -> list[dict]:
        """Every received log record as a dict with its resource attributes (ids in hex)."""
        return self._converted("logs", self.logs, _log_dicts)

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Poll `predicate` until true or timeout."""
        return wait_until(predicate, timeout_s)


def _items(resources, scopes: str, items: str) -> Iterator[tuple[dict, Any, Any]]:  # noqa: ANN001
    """(resource attributes, scope, item) of every item of a request's resource/scope nesting:
    resource_spans/scope_spans/spans, resource_metrics/scope_metrics/metrics, resource_logs/..."""
    for r in resources:
        res = attrs(r.resource.attributes)
        for sc in getattr(r, scopes):
            for item in getattr(sc, items):
                yield res, sc.scope, item


def _span_dicts(req: trace_service_pb2.ExportTraceServiceRequest) -> list[dict]:
    """A request's spans as the dicts tests read (see Store.spans)."""
    return [{"name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
             "parent_span_id": s.parent_span_id.hex(), "start": s.start_time_unix_nano,
             "end": s.end_time_unix_nano, "attributes": attrs(s.attributes),
             "status_code": s.status.code, "status_message": s.status.message,
             "resource": res, "scope": scope.name}
            for res, scope, s in _items(req.resource_spans, "scope_spans", "spans")]


def _point_dicts(req: metrics_service_pb2.ExportMetricsServiceRequest) -> list[dict]:
    """A request's metric data points as dicts (see Store.metric_points)."""
    out = []
    for res, _scope, m in _items(req.resource_metrics, "scope_metrics", "metrics"):
        kind = m.WhichOneof("data")
        for p in getattr(m, kind).data_points:
            value = (p.as_int if p.WhichOneof("value") == "as_int" else p.as_double) \
                if kind in ("sum", "gauge") else {"count": p.count, "sum": p.sum}
            out.append({"name": m.name, "resource": res, "attributes": attrs(p.attributes),
                        "value": value, "time": p.time_unix_nano})
    return out


def _log_dicts(req: logs_service_pb2.ExportLogsServiceRequest) -> list[dict]:
    """A request's log records as dicts (see Store.log_records)."""
    return [{"event_name": r.event_name, "severity_text": r.severity_text,
             "body": any_value(r.body), "attributes": attrs(r.attributes),
             "trace_id": r.trace_id.hex(), "span_id": r.span_id.hex(),
             "time": r.time_unix_nano, "resource": res}
            for res, _scope, r in _items(req.resource_logs, "scope_logs", "log_records")]


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `predicate` every 0.1 s until it holds or `timeout_s` passed; its last answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def serve(port: int = 0) -> tuple[grpc.Server, Store, int]:
    """Start a store on 127.0.0.1:port (0: any free port); returns (server, store, port)."""
    store = Store()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[("grpc.max_receive_message_length", 64 << 20)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(store, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(store, server)
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(store, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, store, bound
