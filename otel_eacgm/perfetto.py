"""A Chrome/Perfetto trace file from the agent's spans, for a timeline without a backend.

`otel-eacgm trace --perfetto out.json -- python train.py` writes the Trace Event Format's JSON
object form: one complete event ("ph": "X") per span, on the process and thread that made the
call, microsecond timestamps, the span's attributes as args, plus process/thread name
metadata. Open it in https://ui.perfetto.dev or chrome://tracing. Events stream to the file as
spans are exported, so memory stays bounded; the closing bracket is written at shutdown.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_eacgm.export import SpanSink
from otel_eacgm.spans import CallSpan


def span_event(span: CallSpan) -> dict:
    """The Trace Event Format complete event of one span."""
    attrs = span.all_attributes()
    start = span.start
    end = span.end or start
    args = {k: (list(v) if isinstance(v, tuple) else v) for k, v in attrs.items()}
    args["span_id"] = f"{span.span_id:016x}"
    args["trace_id"] = f"{span.trace_id:032x}"
    if span.parent_span_id:
        args["parent_span_id"] = f"{span.parent_span_id:016x}"
    return {
        "name": span.name, "cat": str(attrs.get("eacgm.layer", "")), "ph": "X",
        "ts": start / 1000.0, "dur": (end - start) / 1000.0,
        "pid": int(attrs.get("process.pid", 0)), "tid": int(attrs.get("thread.id", 0)), "args": args,
    }


class PerfettoExporter:
    """Writes spans to a Trace Event Format JSON file."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in shutdown
        except OSError as exc:
            raise ValueError(f"perfetto file {path!r} cannot be written: {exc.strerror}") from None
        self._fh.write('{"displayTimeUnit": "ns", "traceEvents": [\n')
        self._first = True
        self._lock = threading.Lock()
        self._names: dict[int, str] = {}
        self._threads: set[tuple[int, int]] = set()
        self.events = 0

    def _write(self, event: dict) -> None:
        self._fh.write(("" if self._first else ",\n") + json.dumps(event, separators=(",", ":")))
        self._first = False

    def export(self, spans: Sequence[CallSpan]) -> SpanExportResult:
        """Append one event per span."""
        with self._lock:
            if self._fh.closed:
                return SpanExportResult.FAILURE
            for span in spans:
                event = span_event(span)
                self._write(event)
                self.events += 1
                pid, tid = event["pid"], event["tid"]
                if pid not in self._names:
                    res = span.resource.attributes if span.resource is not None else {}
                    self._names[pid] = str(res.get("service.name") or res.get("process.executable.name") or pid)
                self._threads.add((pid, tid))
            self._fh.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Write the process/thread names and close the JSON document."""
        with self._lock:
            if self._fh.closed:
                return
            for pid, name in sorted(self._names.items()):
                self._write({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
            for pid, tid in sorted(self._threads):
                self._write({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                             "args": {"name": "main" if pid == tid else f"thread {tid}"}})
            self._fh.write("\n]}\n")
            self._fh.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:  # noqa: ARG002
        """Everything is flushed after each export."""
        return True


class TeeSpanExporter:
    """Exports every batch to several exporters; fails when any fails."""

    def __init__(self, exporters: Sequence[SpanSink]) -> None:
        self.exporters = list(exporters)

    def export(self, spans: Sequence[CallSpan]) -> SpanExportResult:
        """Export to each; SUCCESS only if all succeed."""
        results = [e.export(spans) for e in self.exporters]
        return SpanExportResult.SUCCESS if all(r is SpanExportResult.SUCCESS for r in results) else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        """Shut every exporter down."""
        for e in self.exporters:
            e.shutdown()


class NullMetricExporter(MetricExporter):
    """Metrics go nowhere (a `trace` run without an OTLP endpoint)."""

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object) -> MetricExportResult:  # noqa: ARG002
        """Drop the batch."""
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:  # noqa: ARG002
        """Nothing to flush."""
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:  # noqa: ARG002
        """Nothing to release."""
