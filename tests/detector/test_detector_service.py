"""The detector as a real gRPC service: real OTLP clients in, a real OTLP receiver out."""

from __future__ import annotations

import shutil
import subprocess
import threading

import grpc
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2_grpc import LogsServiceStub
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from eacgm_detector.config import DetectorConfig
from eacgm_detector.exporter import OtlpExporter
from eacgm_detector.pipeline import Detector
from eacgm_detector.records import attributes
from eacgm_detector.service import DetectorService
from eacgm_testkit.recording import SEC, T0, recording, resource_attrs, send

ANOMALIES = {230: "latency", 250: "gpu", 270: "bandwidth", 290: "errors"}
N_WINDOWS, WARMUP = 320, 200
EXPECTED_CATEGORY = {"latency": "latency", "gpu": "gpu", "bandwidth": "communication",
                     "errors": "communication"}


def config(**kw) -> DetectorConfig:
    base = dict(listen="127.0.0.1:0", window_s=1.0, grace_s=0.5, warmup_windows=WARMUP,
                refit_every=1000, history_windows=1000)
    return DetectorConfig(**(base | kw))


def window_of(ns: int) -> int:
    return (ns - T0) // SEC


def test_normal_run_clean_injected_anomalies_flagged(receiver):
    rec, endpoint = receiver
    svc = DetectorService(config(), exporter=OtlpExporter(endpoint)).start()
    reqs = recording([0], N_WINDOWS, ANOMALIES)
    with grpc.insecure_channel(f"127.0.0.1:{svc.port}") as ch:
        for r in reqs:
            send(ch, r)
    svc.stop()  # flushes the last open windows and the exporter

    events = [(lr, rl.resource) for req in rec.logs for rl in req.resource_logs
              for sl in rl.scope_logs for lr in sl.log_records]
    flagged = {window_of(attributes(lr.attributes)["eacgm.anomaly.window.start"]): lr for lr, _ in events}
    assert sorted(flagged) == sorted(ANOMALIES), "exactly the injected windows are anomalies"
    for w, kind in ANOMALIES.items():
        lr = flagged[w]
        attrs = attributes(lr.attributes)
        assert lr.event_name == "eacgm.anomaly" and lr.severity_text == "WARN"
        assert attrs["eacgm.anomaly.score"] < attrs["eacgm.anomaly.threshold"]
        assert attrs["eacgm.anomaly.rule"] == "threshold"  # the default: each window alone
        assert attrs["host.name"] == "node0" and attrs["process.pid"] == "1000"
        cats = [c.string_value for c in lr.attributes[[a.key for a in lr.attributes].index(
            "eacgm.anomaly.categories")].value.array_value.values]
        assert cats[0] == EXPECTED_CATEGORY[kind], (kind, cats)
        shares = [v.double_value for v in lr.attributes[[a.key for a in lr.attributes].index(
            "eacgm.anomaly.feature_shares")].value.array_value.values]
        assert len(shares) == len(cats) and shares == sorted(shares, reverse=True)
        assert 0 < sum(shares) <= 1 + 1e-9 and shares[0] > 0.2, shares  # the top feature explains much
        assert len(lr.trace_id) == 16 and lr.trace_id == (w).to_bytes(16, "big")
        assert "anomaly on host.name=node0" in lr.body.string_value

    # Every received span comes back; those of scored windows carry the verdict.
    sent = sum(len(ss.spans) for r in reqs if isinstance(r, ExportTraceServiceRequest)
               for rs in r.resource_spans for ss in rs.scope_spans)
    back = [sp for req in rec.traces for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans]
    assert len(back) == sent
    verdict = {}
    for sp in back:
        a = attributes(sp.attributes)
        w = window_of(sp.start_time_unix_nano)
        assert ("eacgm.anomaly" in a) == (w >= WARMUP)
        if "eacgm.anomaly" in a:
            verdict.setdefault(w, a["eacgm.anomaly"])
    assert {w for w, v in verdict.items() if v} == set(ANOMALIES)

    points = [dp for req in rec.metrics for rm in req.resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics if m.name == "eacgm.anomaly.score" for dp in m.gauge.data_points]
    assert len(points) == N_WINDOWS - WARMUP


def test_sdk_otlp_exporter_is_accepted():
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    svc = DetectorService(config()).start()
    provider = TracerProvider(resource=Resource({"host.name": "n1", "process.pid": 7}))
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"127.0.0.1:{svc.port}", insecure=True)))
    tracer = provider.get_tracer("t")
    for i in range(5):
        with tracer.start_as_current_span("cudaMalloc", attributes={"eacgm.layer": "cuda.runtime"}):
            pass
    provider.shutdown()
    svc.wait_idle()
    assert svc.detector.counters["spans.accepted"] == 5
    assert list(svc.detector.entities) == [(("host.name", "n1"), ("process.pid", "7"))]
    svc.stop()


def raw_export(channel, method: str, payload: bytes):
    call = channel.unary_unary(method, request_serializer=None,
                               response_deserializer=ExportTraceServiceResponse.FromString)
    return call(payload, timeout=5)


TRACE_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
METRICS_EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


def bad_span_request(n_bad: int, n_good: int) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(resource_attrs(0))
    ss = rs.scope_spans.add()
    for i in range(n_bad):
        ss.spans.add(name="x", trace_id=b"short", span_id=b"s" * 8, start_time_unix_nano=T0,
                     end_time_unix_nano=T0 + 1)
    for i in range(n_good):
        ss.spans.add(name="x", trace_id=b"t" * 16, span_id=b"s" * 8, start_time_unix_nano=T0,
                     end_time_unix_nano=T0 + 1)
    return req


def test_malformed_and_oversized_requests(caplog):
    svc = DetectorService(config(max_request_bytes=20_000)).start()
    with grpc.insecure_channel(f"127.0.0.1:{svc.port}") as ch:
        for method in (TRACE_EXPORT, METRICS_EXPORT):
            with pytest.raises(grpc.RpcError) as err:
                raw_export(ch, method, b"\xff\xff\xff garbage")
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as err:
            raw_export(ch, TRACE_EXPORT, b"\x0a" + b"\x80" * 30_000)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_request_bytes=20000" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            TraceServiceStub(ch).Export(bad_span_request(3, 0), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        resp = TraceServiceStub(ch).Export(bad_span_request(2, 1), timeout=5)
        assert resp.partial_success.rejected_spans == 2
        # Still serving after all that.
        assert TraceServiceStub(ch).Export(bad_span_request(0, 4), timeout=5) is not None
    svc.wait_idle()
    assert svc.detector.counters["spans.accepted"] == 5
    assert sum("not valid OTLP" in r.getMessage() for r in caplog.records) == 2
    assert any("max_request_bytes" in r.getMessage() for r in caplog.records)
    svc.stop()


class BlockedDetector(Detector):
    """A detector whose scoring thread is stuck until released, to fill the queue."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.release = threading.Event()

    def feed_spans(self, records):
        self.release.wait(10)
        return super().feed_spans(records)


def test_overload_gives_back_pressure_not_memory():
    cfg = config(queue_size=2)
    det = BlockedDetector(cfg)
    svc = DetectorService(cfg, det).start()
    codes = []
    with grpc.insecure_channel(f"127.0.0.1:{svc.port}") as ch:
        for _ in range(8):
            try:
                TraceServiceStub(ch).Export(bad_span_request(0, 1), timeout=5)
                codes.append("OK")
            except grpc.RpcError as exc:
                codes.append(exc.code().name)
    assert codes.count("OK") <= 3 and "UNAVAILABLE" in codes
    assert set(codes) <= {"OK", "UNAVAILABLE"}
    det.release.set()
    svc.stop()
    assert det.counters["spans.accepted"] == codes.count("OK")
    assert det.counters["traces.refused_overload"] == codes.count("UNAVAILABLE")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI needed to make a test certificate")
def test_tls(tmp_path):
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    svc = DetectorService(config(listen="localhost:0", tls_cert_file=str(cert), tls_key_file=str(key))).start()
    creds = grpc.ssl_channel_credentials(cert.read_bytes())
    with grpc.secure_channel(f"localhost:{svc.port}", creds) as ch:
        TraceServiceStub(ch).Export(bad_span_request(0, 2), timeout=5)
    with grpc.insecure_channel(f"localhost:{svc.port}") as ch:
        with pytest.raises(grpc.RpcError):
            TraceServiceStub(ch).Export(bad_span_request(0, 2), timeout=2)
    svc.wait_idle()
    assert svc.detector.counters["spans.accepted"] == 2
    svc.stop()


LOGS_EXPORT = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


def log_request(n: int, t_ns: int = T0) -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.extend(resource_attrs(0))
    sl = rl.scope_logs.add()
    for i in range(n):
        sl.log_records.add(time_unix_nano=t_ns + i, severity_text="ERROR",
                           body=AnyValue(string_value="NCCL WARN timeout"))
    sl.log_records.add(severity_text="INFO")  # no timestamp at all: rejected, counted
    return req


def test_logs_service_accepts_records_and_rejects_garbage():
    svc = DetectorService(config()).start()
    with grpc.insecure_channel(f"127.0.0.1:{svc.port}") as ch:
        resp = LogsServiceStub(ch).Export(log_request(3), timeout=5)
        assert resp.partial_success.rejected_log_records == 1
        with pytest.raises(grpc.RpcError) as err:
            raw_export(ch, LOGS_EXPORT, b"\x0a\x05\xff\xff")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    svc.wait_idle()
    svc.stop()
    assert svc.detector.counters["logs.accepted"] == 3
    # The records became a rate feature of the entity's window.
    [ent] = svc.detector.entities.values()
    assert ent.history and "metric.log.records.ERROR.rate" in ent.history[0]


def test_far_oversized_request_is_refused_and_serving_continues():
    # Beyond 2 x max_request_bytes gRPC itself refuses the message before it is buffered
    # whole; between 1x and 2x the handler refuses it with a log line (test above).
    svc = DetectorService(config(max_request_bytes=10_000)).start()
    with grpc.insecure_channel(f"127.0.0.1:{svc.port}") as ch:
        with pytest.raises(grpc.RpcError) as err:
            raw_export(ch, TRACE_EXPORT, b"\x0a" + b"\x80" * 50_000)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        TraceServiceStub(ch).Export(bad_span_request(0, 1), timeout=5)
    svc.wait_idle()
    assert svc.detector.counters["spans.accepted"] == 1
    svc.stop()


def test_shutdown_flushes_open_windows_and_their_anomaly(receiver):
    rec, endpoint = receiver
    last = 239
    svc = DetectorService(config(), exporter=OtlpExporter(endpoint)).start()
    with grpc.insecure_channel(f"127.0.0.1:{svc.port}") as ch:
        for r in recording([0], last + 1, {last: "latency"}):
            send(ch, r)
    svc.wait_idle()
    svc.exporter.flush()
    # The last window is still open (its watermark has not passed): nothing said yet.
    assert not rec.logs
    svc.stop()
    starts = [attributes(lr.attributes)["eacgm.anomaly.window.start"] for req in rec.logs
              for rl in req.resource_logs for sl in rl.scope_logs for lr in sl.log_records]
    assert starts == [T0 + last * SEC]
    assert svc.exporter.counters["logs.sent"] == 1


def test_queued_bytes_beyond_the_budget_are_refused_with_a_retry_delay():
    from google.rpc import error_details_pb2, status_pb2

    cfg = config(max_queued_bytes=1000)
    det = BlockedDetector(cfg)
    svc = DetectorService(cfg, det).start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{svc.port}") as ch:
            stub = TraceServiceStub(ch)
            first = stub.Export.future(bad_span_request(0, 4), timeout=5)  # let in: nothing waits
            first.result()
            with pytest.raises(grpc.RpcError) as err:
                stub.Export(bad_span_request(0, 1), timeout=5)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_queued_bytes=1000" in err.value.details()
            # OTLP's throttling answer: exporters retry RESOURCE_EXHAUSTED only with RetryInfo.
            raw = dict(err.value.trailing_metadata())["grpc-status-details-bin"]
            status = status_pb2.Status.FromString(raw)
            info = error_details_pb2.RetryInfo()
            assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] and status.details[0].Unpack(info)
            assert info.retry_delay.seconds == 1
            det.release.set()
            svc.wait_idle()
            assert svc.queued_bytes == 0
            stub.Export(bad_span_request(0, 1), timeout=5)  # room again
    finally:
        det.release.set()
        svc.stop()
    assert det.counters["traces.refused_memory"] == 1 and det.counters["spans.accepted"] == 5


def test_grpc_refuses_requests_over_twice_max_request_bytes_even_compressed():
    svc = DetectorService(config(max_request_bytes=20_000)).start()
    try:
        # 64 KB of spans that gzip to a few KB: the limit holds for what they decompress to.
        with grpc.insecure_channel(f"127.0.0.1:{svc.port}", compression=grpc.Compression.Gzip) as ch:
            with pytest.raises(grpc.RpcError) as err:
                TraceServiceStub(ch).Export(bad_span_request(0, 1000), timeout=5)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert TraceServiceStub(ch).Export(bad_span_request(0, 10), timeout=5) is not None
    finally:
        svc.stop()
    assert svc.detector.counters["spans.accepted"] == 10
