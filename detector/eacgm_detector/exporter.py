"""Sends the detector's OTLP output on a background thread with a bounded queue.

Scoring never waits on the network: requests queue up to ``queue_size`` requests and
``max_bytes`` bytes, and the oldest pending ones are dropped (and counted) beyond either.
``flush`` waits until the queue is empty, which ``shutdown`` calls so the last windows' events
are not lost.
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
                 queue_size: int = 256, max_bytes: int = 64 << 20, timeout_s: float = 10.0) -> None:
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
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        self._bytes_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="eacgm-detector-export", daemon=True)
        self._thread.start()

    def submit(self, signal: str, request) -> None:
        """Queue ``request`` for the ``signal`` ("logs", "metrics", "traces") service."""
        if request is None:
            return
        size = request.ByteSize()
        while True:
            with self._bytes_lock:
                fits = not self.queued_bytes or self.queued_bytes + size <= self.max_bytes
                if fits:
                    try:
                        self._queue.put_nowait((signal, request, size))
                        self.queued_bytes += size
                        return
                    except queue.Full:
                        pass
            try:
                _, _, dropped = self._queue.get_nowait()
                self._sent(dropped)
                if not self.counters["dropped"]:
                    # Once, not per request: the count is in counters["dropped"].
                    log.warning("OTLP output to %s falls behind: queue of %d requests or %d bytes full, "
                                "dropping the oldest requests", self.endpoint, self._queue.maxsize, self.max_bytes)
                self.counters["dropped"] += 1
            except queue.Empty:
                pass

    def _sent(self, size: int) -> None:
        with self._bytes_lock:
            self.queued_bytes -= size
        self._queue.task_done()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                return
            signal, req, size = item
            try:
                self._send[signal](req, timeout=self.timeout_s, wait_for_ready=True)
                self.counters[f"{signal}.sent"] += 1
            except grpc.RpcError as exc:
                self.counters[f"{signal}.failed"] += 1
                log.warning("OTLP %s export to %s failed: %s", signal, self.endpoint, exc.code())
            finally:
                del item, req
                self._sent(size)

    def flush(self) -> None:
        """Block until every queued request was sent or failed."""
        self._queue.join()

    def shutdown(self) -> None:
        """Flush, stop the thread, close the channel."""
        self.flush()
        self._queue.put(None)
        self._thread.join(timeout=self.timeout_s)
        self._channel.close()
