"""The OTLP gRPC receiver: TraceService, MetricsService and LogsService ``Export``.

Handlers take the raw request bytes, so size and decoding are checked here, with a log
line and a proper status (RESOURCE_EXHAUSTED, INVALID_ARGUMENT) instead of an exception
deep in gRPC. Decoded records go through a bounded queue to a single scoring thread; when
it is full the caller gets UNAVAILABLE, which OTLP exporters retry with back-off: that is
the back-pressure. The queue is bounded in bytes too (``max_queued_bytes``, an estimate of
the decoded records): beyond it the caller gets RESOURCE_EXHAUSTED with a RetryInfo delay,
OTLP's throttling answer. Requests are decoded one at a time, so decoding, which takes
several times a request's size, happens once at a time whatever the number of callers.
The port is bound exclusively (no SO_REUSEPORT): a second detector on it fails to start
instead of silently receiving part of the traffic. ``stop`` drains the queue, closes every
open window and flushes output.
"""

from __future__ import annotations

import errno
import functools
import logging
import math
import queue
import socket
import threading
import time
from concurrent import futures

import grpc
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as logs_pb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as metrics_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_pb

from eacgm_detector import emit
from eacgm_detector.auth import BearerTokenInterceptor
from eacgm_detector.config import DetectorConfig, loopback
from eacgm_detector.exporter import OtlpExporter
from eacgm_detector.pipeline import Detector
from eacgm_detector.records import points_from_logs, points_from_request, spans_from_request
from eacgm_detector.windows import REF_BYTES

log = logging.getLogger(__name__)

_REFUSAL_LOG_INTERVAL_S = 60.0
#: Estimated memory of one decoded span or metric point waiting in the queue, bytes: a record
#: object with its entity, ids, names and numbers (measured: 500 for a span, 380 for a point).
#: A span kept for re-export adds its serialized bytes (at most the request's) and REF_BYTES.
RECORD_BYTES = 512
#: Delay a caller refused for memory is told to wait (RetryInfo), seconds.
RETRY_DELAY_S = 1

_SERVICES = {
    # signal: (gRPC service, request, response, decode, partial-success field)
    "traces": ("opentelemetry.proto.collector.trace.v1.TraceService",
               trace_pb.ExportTraceServiceRequest, trace_pb.ExportTraceServiceResponse,
               spans_from_request, "rejected_spans"),
    "metrics": ("opentelemetry.proto.collector.metrics.v1.MetricsService",
                metrics_pb.ExportMetricsServiceRequest, metrics_pb.ExportMetricsServiceResponse,
                points_from_request, "rejected_data_points"),
    "logs": ("opentelemetry.proto.collector.logs.v1.LogsService",
             logs_pb.ExportLogsServiceRequest, logs_pb.ExportLogsServiceResponse,
             points_from_logs, "rejected_log_records"),
}


class DetectorService:
    """A running detector: gRPC server, scoring thread and optional OTLP exporter."""

    def __init__(self, cfg: DetectorConfig, detector: Detector | None = None,
                 exporter: OtlpExporter | None = None) -> None:
        self.cfg = cfg.validate()
        self.detector = detector or Detector(cfg, clock=time.monotonic)
        self.exporter = exporter
        self._queue: queue.Queue = queue.Queue(maxsize=cfg.queue_size)
        self._worker = threading.Thread(target=self._run, name="eacgm-detector-score", daemon=True)
        self._last_logged: dict[str, float] = {}
        self._logged_count: dict[str, int] = {}
        self._insecure = cfg.check_listen()
        # Spans are kept (as bytes) only for the annotated re-export.
        self._keep_spans = exporter is not None and cfg.reexport_spans
        self._decoding = threading.Lock()
        self._queued_lock = threading.Lock()
        self.queued_bytes = 0  # estimated bytes of the decoded requests queued or being windowed
        self.auth = BearerTokenInterceptor(cfg.bearer_token) if cfg.bearer_token else None
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="eacgm-detector-rpc"),
            interceptors=[self.auth] if self.auth else None,
            # No SO_REUSEPORT: with it a second server binds the same port and the kernel
            # spreads connections over both, each detector seeing part of every entity.
            options=[("grpc.max_receive_message_length", 2 * cfg.max_request_bytes), ("grpc.so_reuseport", 0)])
        handlers = [grpc.method_handlers_generic_handler(
            name, {"Export": grpc.unary_unary_rpc_method_handler(
                self._handler(signal), response_serializer=resp.SerializeToString)})
            for signal, (name, _, resp, _, _) in _SERVICES.items()]
        self._server.add_generic_rpc_handlers(handlers)
        try:
            if cfg.tls_cert_file:
                creds = grpc.ssl_server_credentials([(open(cfg.tls_key_file, "rb").read(),
                                                      open(cfg.tls_cert_file, "rb").read())])
                self.port = self._server.add_secure_port(cfg.listen, creds)
            else:
                self.port = self._server.add_insecure_port(cfg.listen)
        except RuntimeError:  # grpcio raises it when nothing could be bound
            self.port = 0
        if self.port == 0:
            raise ValueError(f"listen: cannot bind {cfg.listen!r}: {_bind_error(cfg.listen)}")
        if cfg.bearer_token and not cfg.tls_cert_file and not loopback(cfg.listen):
            log.warning("bearer_token is set but TLS is off on %s: the token crosses the network in clear text; "
                        "set tls_cert_file/tls_key_file", cfg.listen)

    def start(self) -> "DetectorService":
        """Start serving; returns self."""
        self._worker.start()
        self._server.start()
        log.info("detector listening on %s (port %d, %s, %s)", self.cfg.listen, self.port,
                 "TLS" if self.cfg.tls_cert_file else "plaintext",
                 "bearer token required" if self.auth else "no authentication")
        if self._insecure:
            log.warning("listening on %s in plaintext without authentication, as insecure_listen allows: "
                        "anyone who reaches it can send telemetry; set tls_cert_file/tls_key_file and "
                        "bearer_token", self.cfg.listen)
        return self

    def _handler(self, signal: str):
        _, req_cls, resp_cls, decode, rejected_field = _SERVICES[signal]
        keys = tuple(self.cfg.entity_attributes)
        if signal == "traces":
            decode = functools.partial(decode, keep_spans=self._keep_spans)

        def export(raw: bytes, context: grpc.ServicerContext):
            if len(raw) > self.cfg.max_request_bytes:
                self._refused(signal, "oversize", "%s request from %s rejected: %d bytes > max_request_bytes=%d",
                              signal, context.peer(), len(raw), self.cfg.max_request_bytes)
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"request of {len(raw)} bytes exceeds max_request_bytes={self.cfg.max_request_bytes}")
            if self.queued_bytes >= self.cfg.max_queued_bytes:  # before decoding, which takes memory
                self._shed(signal, context, len(raw))
            try:
                with self._decoding:
                    records, rejected = decode(req_cls.FromString(raw), keys)
            except (DecodeError, ValueError, UnicodeDecodeError) as exc:
                self._refused(signal, "malformed", "%s request from %s is not valid OTLP: %s", signal, context.peer(), exc)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {signal} request: {exc}")
            if rejected and not records:
                self._refused(signal, "invalid", "%s request from %s: all %d items invalid (timestamps or ids)",
                              signal, context.peer(), rejected)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"all {rejected} {signal} items invalid: need timestamps (before 2200), "
                              "end >= start, 16-byte trace and 8-byte span ids")
            cost = len(records) * RECORD_BYTES
            if signal == "traces" and self._keep_spans:
                cost += len(raw) + len(records) * REF_BYTES
            with self._queued_lock:
                # One request is let in when none waits, however large: the detector must progress.
                fits = not self.queued_bytes or self.queued_bytes + cost <= self.cfg.max_queued_bytes
                if fits:
                    self.queued_bytes += cost
            if not fits:
                self._shed(signal, context, len(raw))
            try:
                self._queue.put_nowait((signal, records, cost))
            except queue.Full:
                self._release(cost)
                self.detector.counters[f"{signal}.refused_overload"] += 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "detector overloaded, retry later")
            resp = resp_cls()
            if rejected:
                setattr(resp.partial_success, rejected_field, rejected)
                resp.partial_success.error_message = "items without timestamps or valid ids were rejected"
            return resp

        return export

    def _shed(self, signal: str, context: grpc.ServicerContext, size: int) -> None:
        """Refuse a request for memory: RESOURCE_EXHAUSTED with RetryInfo, so that OTLP
        exporters (the Collector's included) retry it after the delay instead of dropping it."""
        self._refused(signal, "memory", "%s request of %d bytes from %s refused: decoded requests waiting hold "
                      "~%d bytes, max_queued_bytes=%d", signal, size, context.peer(), self.queued_bytes,
                      self.cfg.max_queued_bytes)
        message = (f"detector busy: decoded requests waiting hold ~{self.queued_bytes} bytes "
                   f"(max_queued_bytes={self.cfg.max_queued_bytes}), retry in {RETRY_DELAY_S} s")
        context.set_trailing_metadata((("grpc-status-details-bin", _retry_status(message)),))
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)

    def _release(self, cost: int) -> None:
        with self._queued_lock:
            self.queued_bytes -= cost

    def _refused(self, signal: str, reason: str, message: str, *args: object) -> None:
        """Count a refused request; log it at most once per reason and minute (a flood of bad
        requests must not become a flood of log lines), saying how many were not logged."""
        key = f"{signal}.refused_{reason}"
        self.detector.counters[key] += 1
        now = time.monotonic()
        if now - self._last_logged.get(key, -math.inf) < _REFUSAL_LOG_INTERVAL_S:
            return
        unlogged = self.detector.counters[key] - self._logged_count.get(key, 0) - 1
        self._last_logged[key], self._logged_count[key] = now, self.detector.counters[key]
        log.warning(message + (f" ({unlogged} more since the last such line)" if unlogged else ""), *args)

    def _run(self) -> None:
        while True:
            item, signal = self._queue.get(), "?"
            try:
                if item is None:
                    return
                signal, records, cost = item
                item = None
                try:
                    if signal == "traces":
                        self.detector.feed_spans(records)
                    else:
                        self.detector.feed_points(records, "points" if signal == "metrics" else "logs")
                finally:
                    records = None  # what the windows did not keep is gone: its bytes are free
                    self._release(cost)
                self._emit(self.detector.ready())
            except Exception:  # the scoring thread must survive one bad batch
                log.exception("scoring a %s batch failed", signal)
            finally:
                self._queue.task_done()

    def _emit(self, results) -> None:
        if not results or self.exporter is None:
            return
        self.exporter.submit("logs", emit.logs_request(results, self.cfg.instance_id))
        self.exporter.submit("metrics", emit.score_request(results, self.cfg.instance_id))
        if self.cfg.reexport_spans:
            self.exporter.submit("traces", emit.spans_request(results))

    def wait_idle(self) -> None:
        """Block until every accepted request has been windowed and scored."""
        self._queue.join()

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, score what was accepted plus every open window, flush output."""
        self._server.stop(grace_s).wait()
        self._queue.put(None)
        self._worker.join()
        self._emit(self.detector.drain())
        if self.exporter is not None:
            self.exporter.shutdown()
            log.info("detector output: %s", dict(self.exporter.counters))
        log.info("detector stopped: %s", dict(self.detector.counters))


def _retry_status(message: str) -> bytes:
    """A google.rpc.Status of RESOURCE_EXHAUSTED with RetryInfo, as gRPC's status details."""
    info = error_details_pb2.RetryInfo()
    info.retry_delay.FromSeconds(RETRY_DELAY_S)
    status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=message)
    status.details.add().Pack(info)
    return status.SerializeToString()


def _bind_error(listen: str) -> str:
    """Why ``listen`` cannot be bound, found by binding a plain socket to it (gRPC only says
    that it failed)."""
    host, _, port = listen.rpartition(":")
    try:
        addrs = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (OSError, ValueError) as exc:
        return f"cannot resolve it ({exc})"
    for family, kind, proto, _, addr in addrs:
        with socket.socket(family, kind, proto) as sock:
            try:
                sock.bind(addr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return "address already in use (another detector, or another program, listens there)"
                return exc.strerror or str(exc)
    return "gRPC could not bind it"
