"""OTLP export of spans and metrics through the OpenTelemetry SDK's exporters.

Spans are not created through a Tracer: they are built from call records (spans.py) and handed
to a bounded queue drained by one thread, so memory stays bounded when the collector is slow or
down and every span is either exported or counted as dropped. The export thread encodes each
batch to OTLP bytes itself (otlp_spans.py) and sends them through the SDK's own gRPC or HTTP
exporter, so the standard OTEL_EXPORTER_OTLP_* settings (endpoint, insecure, headers,
compression, timeout, certificates), its retries and its self-metrics all still apply.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (Metric, MetricExporter, MetricExportResult, MetricsData,
                                              PeriodicExportingMetricReader, ResourceMetrics, ScopeMetrics)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_eacgm.otlp_spans import SpanEncoder
from otel_eacgm.spans import CallSpan

log = logging.getLogger(__name__)

PROTOCOLS = ("grpc", "http/protobuf")
_TRACE_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class SpanSink(Protocol):
    """Where the queue's batches go: an OTLP endpoint, the Perfetto file, or both."""

    def export(self, spans: Sequence[CallSpan]) -> SpanExportResult: ...

    def shutdown(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class EncodedSpans:
    """One batch as OTLP request bytes, and how many spans are in it (the SDK's self-metrics)."""

    payload: bytes
    count: int


def _grpc_exporter(endpoint: str | None, insecure: bool | None, timeout_s: float | None) -> Any:
    from grpc import Channel
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    class RawTraceStub:
        """TraceService's Export taking request bytes as they are (no message to serialize)."""

        def __init__(self, channel: Channel) -> None:
            self.Export = channel.unary_unary(_TRACE_EXPORT, request_serializer=None,  # noqa: N815 - the RPC's name
                                              response_deserializer=ExportTraceServiceResponse.FromString)

    class EncodedGrpcExporter(OTLPSpanExporter):
        """The SDK's gRPC span exporter (channel, headers, compression, retries) sending ready bytes."""

        def _initialize_channel_and_stub(self) -> None:  # also run when the SDK reconnects
            super()._initialize_channel_and_stub()
            self._client = RawTraceStub(self._channel)

        def _translate_data(self, data: EncodedSpans) -> bytes:  # type: ignore[override]
            return data.payload

        def _count_data(self, data: EncodedSpans) -> int:  # type: ignore[override]
            return data.count

    return EncodedGrpcExporter(endpoint=endpoint, insecure=insecure, timeout=timeout_s)


def _http_exporter(endpoint: str | None, timeout_s: float | None) -> Any:
    from opentelemetry.exporter.otlp.proto.http._common import _is_request_too_large
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    class EncodedHttpExporter(HttpExporter):
        """The SDK's HTTP span exporter (session, headers, compression, retries) posting ready bytes."""

        def export(self, spans: EncodedSpans) -> SpanExportResult:  # type: ignore[override]
            if self._shutdown:
                log.warning("span exporter already shut down: batch dropped")
                return SpanExportResult.FAILURE
            if _is_request_too_large(spans.payload, self._max_request_size):
                log.warning("span batch of %d bytes over the exporter's max_request_size: dropped", len(spans.payload))
                return SpanExportResult.FAILURE
            with self._metrics.export_operation(spans.count) as result:
                outcome = self._client.export(spans.payload)
                if not outcome.success:
                    result.error = outcome.error
                    return SpanExportResult.FAILURE
            return SpanExportResult.SUCCESS

    url = f"{endpoint.rstrip('/')}/v1/traces" if endpoint else None
    return EncodedHttpExporter(endpoint=url, timeout=timeout_s)


class OtlpSpanSink:
    """Encodes each batch to OTLP bytes (SpanEncoder) and sends it with the SDK's exporter."""

    def __init__(self, exporter: Any) -> None:
        self._exporter = exporter
        self._encoder = SpanEncoder()

    def export(self, spans: Sequence[CallSpan]) -> SpanExportResult:
        """Encode and send one batch."""
        return self._exporter.export(EncodedSpans(self._encoder.request(spans), len(spans)))

    def shutdown(self) -> None:
        """Shut the SDK exporter down (its channel or session)."""
        self._exporter.shutdown()


def span_exporter(protocol: str, endpoint: str | None, insecure: bool | None, timeout_s: float | None) -> OtlpSpanSink:
    """An OTLP span sink; None arguments fall back to the standard OTEL_EXPORTER_OTLP_* variables."""
    if protocol == "grpc":
        return OtlpSpanSink(_grpc_exporter(endpoint, insecure, timeout_s))
    if protocol == "http/protobuf":
        return OtlpSpanSink(_http_exporter(endpoint, timeout_s))
    raise ValueError(f"exporter protocol {protocol!r} is not one of {PROTOCOLS}")


def metric_exporter(protocol: str, endpoint: str | None, insecure: bool | None, timeout_s: float | None) -> MetricExporter:
    """An OTLP metric exporter, configured like span_exporter."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(endpoint=endpoint, insecure=insecure, timeout=timeout_s)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

        url = f"{endpoint.rstrip('/')}/v1/metrics" if endpoint else None
        return HttpExporter(endpoint=url, timeout=timeout_s)
    raise ValueError(f"exporter protocol {protocol!r} is not one of {PROTOCOLS}")


class ProducingMetricExporter(MetricExporter):
    """Adds metrics made outside the SDK's instruments to every export.

    The call statistics arrive from the kernel already aggregated (cumulative histograms), which
    no OpenTelemetry instrument can take; they are appended here, under their own scope, so they
    leave with the other metrics at the same interval. Each data point goes under the resource
    of the process it counts (`resource_for` its ``process.pid``), so an application's call
    counts and latencies sit under its own service in any backend; a process whose resource is
    not known any more keeps the last one seen, and points of no process go under `resource`,
    the agent's.
    """

    def __init__(self, inner: MetricExporter, produce: Callable[[], list[Metric]], resource: Resource,
                 scope: InstrumentationScope, resource_for: Callable[[int], Resource | None] | None = None) -> None:
        super().__init__(preferred_temporality=inner._preferred_temporality,  # noqa: SLF001 - pass-through
                         preferred_aggregation=inner._preferred_aggregation)  # noqa: SLF001
        self._inner = inner
        self._produce = produce
        self._resource = resource
        self._scope = scope
        self._resource_for = resource_for
        self._seen: dict[int, Resource] = {}

    def _owner(self, pid: object) -> Resource:
        if self._resource_for is None or not isinstance(pid, int):
            return self._resource
        res = self._resource_for(pid)
        if res is not None:
            self._seen[pid] = res
        return self._seen.get(pid, self._resource)

    def _by_resource(self, metrics: list[Metric]) -> dict[Resource, list[Metric]]:
        """`metrics` split by the resource of each data point's process."""
        points: dict[tuple[Resource, str], list[object]] = {}
        pids = set()
        for metric in metrics:
            for point in metric.data.data_points:
                pid = (point.attributes or {}).get("process.pid")
                pids.add(pid)
                key = (self._owner(pid), metric.name)
                points.setdefault(key, []).append(point)
        # a process no point names any more has been forgotten by the statistics: so is its resource
        self._seen = {pid: res for pid, res in self._seen.items() if pid in pids}
        out: dict[Resource, list[Metric]] = {}
        for metric in metrics:
            for (res, name), mine in points.items():
                if name == metric.name:
                    data = dataclasses.replace(metric.data, data_points=mine)
                    out.setdefault(res, []).append(dataclasses.replace(metric, data=data))
        return out

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object) -> MetricExportResult:
        """Export the SDK's batch plus the produced metrics."""
        extra = self._produce()
        if extra:
            resources = list(metrics_data.resource_metrics)
            for res, metrics in self._by_resource(extra).items():
                mine = ScopeMetrics(self._scope, metrics, schema_url="")
                for i, rm in enumerate(resources):
                    if rm.resource == res:
                        resources[i] = ResourceMetrics(rm.resource, [*rm.scope_metrics, mine], rm.schema_url)
                        break
                else:
                    resources.append(ResourceMetrics(res, [mine], schema_url=""))
            metrics_data = MetricsData(resources)
        return self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Flush the wrapped exporter."""
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        """Shut the wrapped exporter down."""
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def meter_provider(exporter: MetricExporter, interval_s: float, resource: Resource) -> MeterProvider:
    """A MeterProvider exporting every `interval_s` seconds."""
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=interval_s * 1000)
    return MeterProvider(metric_readers=[reader], resource=resource)


class SpanQueue:
    """Bounded span queue with one export thread; counts what it exports and what it drops.

    A full queue drops the *new* span (the oldest ones are already batched for export) and
    counts it; a failed export counts its spans as dropped, tells `on_failure` (the endpoint
    check, endpoint_check.ExportDiagnosis) and the queue carries on.
    """

    def __init__(self, exporter: SpanSink, *, max_size: int = 65536, batch_size: int = 512,
                 interval_s: float = 0.5, on_failure: Callable[[], object] | None = None) -> None:
        if max_size < batch_size or batch_size <= 0:
            raise ValueError(f"queue max_size {max_size} must be >= batch_size {batch_size} > 0")
        self._exporter = exporter
        self._queue: collections.deque[CallSpan] = collections.deque()
        self._max = max_size
        self._batch = batch_size
        self._interval = interval_s
        self._on_failure = on_failure  # told of each failed export, on the export thread
        self._cond = threading.Condition()
        self._closing = False
        self.enqueued = 0
        self.exported = 0
        self._dropped_full = 0  # counted by the producer (put) only
        self._dropped_failed = 0  # counted by the export thread (and close, after it) only
        self.export_failures = 0
        self._thread = threading.Thread(target=self._run, name="otel-eacgm-export", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Spans dropped: the queue was full, or their export failed."""
        return self._dropped_full + self._dropped_failed

    def put(self, span: CallSpan) -> None:
        """Queue one span (never blocks). No lock per span: a deque's append and popleft are
        atomic, each counter has one writer, and the export thread is woken once per batch."""
        queue = self._queue
        if len(queue) >= self._max:
            self._dropped_full += 1
            return
        queue.append(span)
        self.enqueued += 1
        if len(queue) % self._batch == 0:
            with self._cond:
                self._cond.notify()

    def __len__(self) -> int:
        return len(self._queue)

    def _take(self) -> list[CallSpan]:
        n = min(self._batch, len(self._queue))
        return [self._queue.popleft() for _ in range(n)]

    def _export(self, batch: Sequence[CallSpan]) -> None:
        try:
            result = self._exporter.export(batch)
        except Exception:  # an exporter bug must not kill the export thread
            log.exception("span export raised")
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self.exported += len(batch)
        else:
            self.export_failures += 1
            self._dropped_failed += len(batch)
            log.warning("span export failed: %d spans dropped (%d so far)", len(batch), self.dropped)
            if self._on_failure is not None:
                self._on_failure()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._closing:
                    self._cond.wait(self._interval)
                elif len(self._queue) < self._batch and not self._closing:
                    self._cond.wait(self._interval)
                batch = self._take()
                closing = self._closing
            if batch:
                self._export(batch)
            elif closing:
                return

    def close(self, timeout_s: float = 30.0) -> None:
        """Export what is queued (up to timeout_s), then shut the exporter down."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout_s)
        with self._cond:
            if self._queue:
                self._dropped_failed += len(self._queue)
                log.warning("shutdown: %d queued spans not exported in %.0fs", len(self._queue), timeout_s)
                self._queue.clear()
        self._exporter.shutdown()


def wait_drained(queue: SpanQueue, timeout_s: float) -> bool:
    """Wait until the queue is empty (for flushing before a final report)."""
    deadline = time.monotonic() + timeout_s
    while len(queue) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not len(queue)
