"""The detector killed (SIGKILL) behind a real Collector and restarted: the Collector keeps
accepting and queues, the restarted detector reloads its model from disk and scores at once
(no warm-up), and the windows sent while it was down are delivered and scored."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc
import yaml
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import MetricsServiceStub
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

from collector_proc import CollectorProcess
from detector_models import write_model
from detector_proc import DetectorProcess
from eacgm_detector.emit import kv

SEC = 10**9
ENTITY = "restart-node"


def _window(base_ns: int, w: int) -> tuple[ExportTraceServiceRequest, ExportMetricsServiceRequest]:
    t0 = base_ns + w * SEC
    tr = ExportTraceServiceRequest()
    rs = tr.resource_spans.add()
    rs.resource.attributes.append(kv("host.name", ENTITY))
    ss = rs.scope_spans.add()
    for i in range(50):
        start = t0 + i * 10**7
        sp = ss.spans.add(name="cudaLaunchKernel", trace_id=(w + 1).to_bytes(16, "big"),
                          span_id=(w * 100 + i + 1).to_bytes(8, "big"),
                          start_time_unix_nano=start, end_time_unix_nano=start + 10_000)
        sp.attributes.extend([kv("eacgm.layer", "cuda.runtime"), kv("code.function.name", "cudaLaunchKernel")])
    mt = ExportMetricsServiceRequest()
    rm = mt.resource_metrics.add()
    rm.resource.attributes.append(kv("host.name", ENTITY))
    m = rm.scope_metrics.add().metrics.add(name="hw.gpu.utilization", unit="1")
    m.gauge.data_points.add(time_unix_nano=t0 + SEC // 2, as_double=0.8)
    return tr, mt


def _collector_config(path: Path, detector_port: int) -> Path:
    exporter = {"endpoint": f"127.0.0.1:{detector_port}", "tls": {"insecure": True},
                "retry_on_failure": {"initial_interval": "200ms", "max_interval": "1s", "max_elapsed_time": "120s"},
                # One consumer keeps redelivered batches in order: the detector windows by event
                # time, and data older than the watermark minus grace_s is late (counted, dropped).
                "sending_queue": {"queue_size": 1000, "num_consumers": 1}}
    path.write_text(yaml.safe_dump({
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:${env:EACGM_COLLECTOR_GRPC_PORT}"}}}},
        "exporters": {"otlp_grpc/detector": exporter},
        "service": {"telemetry": {"metrics": {"level": "none"}},
                    "pipelines": {p: {"receivers": ["otlp"], "exporters": ["otlp_grpc/detector"]}
                                  for p in ("traces", "metrics")}},
    }))
    return path


def _scored_windows(sink, base_ns: int) -> set[int]:  # noqa: ANN001 - otlp_counter.Counter
    """Window indices with an eacgm.anomaly.score point (stamped at the window's end)."""
    return {round((p["time"] - base_ns) / SEC) - 1 for p in sink.detector_scores
            if p["entity"].get("host.name") == ENTITY}


def test_detector_killed_and_restarted_behind_the_collector(counter, tmp_path: Path) -> None:  # noqa: ANN001
    sink, sink_port = counter
    model = write_model(tmp_path / "model.npz")
    det = DetectorProcess(tmp_path, export_endpoint=f"127.0.0.1:{sink_port}", window_s=1.0, grace_s=1.0,
                          model_path=str(model)).start()
    collector = CollectorProcess(0, tmp_path / "collector.log",
                                 config=_collector_config(tmp_path / "c.yaml", det.port)).start()
    base = (time.time_ns() // SEC - 600) * SEC
    try:
        with grpc.insecure_channel(f"127.0.0.1:{collector.grpc_port}") as ch:
            traces, metrics = TraceServiceStub(ch), MetricsServiceStub(ch)

            def send(windows: range) -> None:
                for w in windows:  # every export is accepted by the Collector, detector up or not
                    tr, mt = _window(base, w)
                    traces.Export(tr, timeout=10)
                    metrics.Export(mt, timeout=10)
                    time.sleep(0.05)

            send(range(0, 10))
            # A window closes once data 1 s (grace_s) past its end arrives: 0..7 of 0..9.
            assert sink.wait_for(lambda: set(range(0, 8)) <= _scored_windows(sink, base), 30), \
                (_scored_windows(sink, base), det.log()[-3000:])
            assert det.stop(signal.SIGKILL) == -signal.SIGKILL
            send(range(10, 20))
            time.sleep(1)
            assert collector.alive(), collector.log()[-3000:]
            assert not set(range(10, 20)) & _scored_windows(sink, base)

            det.start()  # same port, same model file
            send(range(20, 25))
            # Windows 8 and 9 were open in the killed process: lost with it (nothing but the model
            # is on disk). The ones sent while it was down are redelivered by the Collector.
            expected = set(range(0, 8)) | set(range(10, 23))
            assert sink.wait_for(lambda: expected <= _scored_windows(sink, base), 60), \
                (sorted(expected - _scored_windows(sink, base)), det.log()[-3000:], collector.log()[-2000:])
        assert collector.alive()
        assert "Traceback" not in det.log()
    finally:
        if collector.alive():
            collector.stop()
        if det.alive():
            det.stop()
