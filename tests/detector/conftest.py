"""Shared fixtures: a real in-test OTLP gRPC receiver for the detector's output."""

from __future__ import annotations

import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

sys.path.insert(0, str(Path(__file__).parent))


class Receiver(trace_service_pb2_grpc.TraceServiceServicer,
               metrics_service_pb2_grpc.MetricsServiceServicer,
               logs_service_pb2_grpc.LogsServiceServicer):
    """Collects what the detector exports, like a collector's OTLP receiver would."""

    def __init__(self) -> None:
        self.traces, self.metrics, self.logs = [], [], []
        self.lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 (gRPC method name)
        with self.lock:
            if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
                self.traces.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()
            if isinstance(request, metrics_service_pb2.ExportMetricsServiceRequest):
                self.metrics.append(request)
                return metrics_service_pb2.ExportMetricsServiceResponse()
            self.logs.append(request)
            return logs_service_pb2.ExportLogsServiceResponse()


@pytest.fixture
def receivers():
    """Factory of (Receiver, "127.0.0.1:port"), each a real gRPC server until the test ends."""
    servers = []

    def start():
        rec = Receiver()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(rec, server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(rec, server)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(rec, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return rec, f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(0).wait()


@pytest.fixture
def receiver(receivers):
    """(Receiver, "127.0.0.1:port") served by a real gRPC server for the test's duration."""
    return receivers()
