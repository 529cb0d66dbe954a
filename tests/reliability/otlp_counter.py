"""An OTLP gRPC receiver that counts spans instead of keeping them, for long and fast runs.

eacgm_testkit.otlp_store keeps every request, which a 10-minute run at tens of thousands of spans
per second would turn into gigabytes. This sink keeps, per traced process, the span count and
the newest span end; the agent's self-telemetry (scope ``otel-eacgm.agent``) as the latest value
per metric, attributes and agent pid; and the detector's output (anomaly score points, log
records) as small lists, since the detector emits one per window.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from concurrent import futures

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from eacgm_testkit.otlp_store import attrs, wait_until

AGENT_SCOPE = "otel-eacgm.agent"
DETECTOR_SCOPE = "eacgm_detector"


class Counter(trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer,
              logs_service_pb2_grpc.LogsServiceServicer):
    """Servicer for the three OTLP services; every figure is read under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans_by_pid: collections.Counter[int] = collections.Counter()
        self.newest_end_ns: dict[int, int] = {}
        self.span_requests = 0
        self._agent: dict[tuple, float] = {}
        self.detector_scores: list[dict] = []
        self.detector_logs: list[dict] = []
        self.detector_spans = 0

    def Export(self, request, context):  # noqa: N802, ANN001, ANN201 - gRPC naming
        if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
            self._traces(request)
            return trace_service_pb2.ExportTraceServiceResponse()
        if isinstance(request, metrics_service_pb2.ExportMetricsServiceRequest):
            self._metrics(request)
            return metrics_service_pb2.ExportMetricsServiceResponse()
        self._logs(request)
        return logs_service_pb2.ExportLogsServiceResponse()

    def _traces(self, req: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self._lock:
            self.span_requests += 1
            for rs in req.resource_spans:
                res = attrs(rs.resource.attributes)
                if res.get("service.name") == "otel-eacgm-detector":
                    self.detector_spans += sum(len(ss.spans) for ss in rs.scope_spans)
                    continue
                pid = _pid(res)
                for ss in rs.scope_spans:
                    self.spans_by_pid[pid] += len(ss.spans)
                    if ss.spans:
                        newest = max(s.end_time_unix_nano for s in ss.spans)
                        self.newest_end_ns[pid] = max(self.newest_end_ns.get(pid, 0), newest)

    def _metrics(self, req: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        with self._lock:
            for rm in req.resource_metrics:
                res = attrs(rm.resource.attributes)
                for sm in rm.scope_metrics:
                    if sm.scope.name == AGENT_SCOPE:
                        pid = _pid(res)
                        for m in sm.metrics:
                            for p in getattr(m, m.WhichOneof("data")).data_points:
                                key = (pid, m.name, tuple(sorted(attrs(p.attributes).items())))
                                self._agent[key] = p.as_int if p.WhichOneof("value") == "as_int" else p.as_double
                    elif sm.scope.name == DETECTOR_SCOPE:
                        for m in sm.metrics:
                            for p in m.gauge.data_points:
                                self.detector_scores.append({"entity": res, "time": p.time_unix_nano,
                                                             "value": p.as_double, "received": time.monotonic()})

    def _logs(self, req: logs_service_pb2.ExportLogsServiceRequest) -> None:
        with self._lock:
            for rl in req.resource_logs:
                res = attrs(rl.resource.attributes)
                for sl in rl.scope_logs:
                    for rec in sl.log_records:
                        self.detector_logs.append({"entity": res, "body": rec.body.string_value,
                                                   "attributes": attrs(rec.attributes)})

    def spans(self, pid: int) -> int:
        """Spans received from traced process `pid`."""
        with self._lock:
            return self.spans_by_pid[pid]

    def agent_metric(self, agent_pid: int, name: str, **attributes: str) -> float | None:
        """Latest value of the agent's self-telemetry metric `name` with exactly these attributes."""
        key = (agent_pid, name, tuple(sorted(attributes.items())))
        with self._lock:
            return self._agent.get(key)

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Poll `predicate` until true or timeout."""
        return wait_until(predicate, timeout_s)


def _pid(resource: dict) -> int:
    """process.pid of a resource; -1 when absent or not an int (the detector's fuzz tests
    re-export whatever they were sent)."""
    pid = resource.get("process.pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else -1


def serve(port: int = 0) -> tuple[grpc.Server, Counter, int]:
    """Start a counter on 127.0.0.1:port (0: any free port); returns (server, counter, port)."""
    counter = Counter()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(counter, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(counter, server)
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(counter, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, counter, bound
