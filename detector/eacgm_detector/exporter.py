"""Sends the detector's OTLP output on a background thread with a bounded queue.

Scoring never waits on the network: requests queue up to ``queue_size`` and the oldest
pending one is dropped (and counted) beyond it. ``flush`` waits until the queue is empty,
which ``shutdown`` calls so the last windows' events are not lost.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter

import grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2_grpc import LogsServiceStub
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import MetricsServiceStub
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

log = logging.getLogger(__name__)


class OtlpExporter:
    """OTLP gRPC client for logs, metrics and traces."""

    def __init__(self, endpoint: str, *, insecure: bool = True, ca_file: str | None = None,
                 queue_size: int = 256, timeout_s: float = 10.0) -> None:
        if insecure:
            self._channel = grpc.insecure_channel(endpoint)
        else:
            roots = open(ca_file, "rb").read() if ca_file else None
            self._channel = grpc.secure_channel(endpoint, grpc.ssl_channel_credentials(roots))
        self._send = {
            "logs": LogsServiceStub(self._channel).Export,
            "metrics": MetricsServiceStub(self._channel).Export,
            "traces": TraceServiceStub(self._channel).Export,
        }
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.counters: Counter[str] = Counter()
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._run, name="eacgm-detector-export", daemon=True)
        self._thread.start()

    def submit(self, signal: str, request) -> None:
        """Queue ``request`` for the ``signal`` ("logs", "metrics", "traces") service."""
        if request is None:
            return
        while True:
            try:
                self._queue.put_nowait((signal, request))
                return
            except queue.Full:
                try:
                    self._queue.get_nowait()
                    self._queue.task_done()
                    if not self.counters["dropped"]:
                        # Once, not per request: the count is in counters["dropped"].
                        log.warning("OTLP output to %s falls behind: queue of %d full, dropping "
                                    "the oldest requests", self.endpoint, self._queue.maxsize)
                    self.counters["dropped"] += 1
                except queue.Empty:
                    pass

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                signal, req = item
                try:
                    self._send[signal](req, timeout=self.timeout_s, wait_for_ready=True)
                    self.counters[f"{signal}.sent"] += 1
                except grpc.RpcError as exc:
                    self.counters[f"{signal}.failed"] += 1
                    log.warning("OTLP %s export to %s failed: %s", signal, self.endpoint, exc.code())
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Block until every queued request was sent or failed."""
        self._queue.join()

    def shutdown(self) -> None:
        """Flush, stop the thread, close the channel."""
        self.flush()
        self._queue.put(None)
        self._thread.join(timeout=self.timeout_s)
        self._channel.close()
