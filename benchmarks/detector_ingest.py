"""Throughput of the detector in one process: span ingestion and window scoring."""

from __future__ import annotations

import time

import grpc
import numpy as np
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

from eacgm_detector.config import DetectorConfig
from eacgm_detector.emit import kv
from eacgm_detector.model import GMMDetector
from eacgm_detector.pipeline import Detector
from eacgm_detector.service import DetectorService

T0 = 1_760_000_000 * 10**9
FUNCS = [("cuda.runtime", "cudaLaunchKernel"), ("cuda.runtime", "cudaMemcpyAsync"),
         ("nccl", "ncclAllReduce"), ("torch", "aten::addmm")]


def batch(i: int, n: int = 2000, per_s: int = 20000) -> bytes:
    """A serialized request of ``n`` spans, batch ``i`` of a steady ``per_s`` spans/s run."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend([kv("host.name", "bench"), kv("process.pid", 1)])
    ss = rs.scope_spans.add()
    for j in range(n):
        layer, fn = FUNCS[j % len(FUNCS)]
        start = T0 + (i * n + j) * (10**9 // per_s)
        sp = ss.spans.add(name=fn, trace_id=(i * n + j + 1).to_bytes(16, "big"),
                          span_id=(j + 1).to_bytes(8, "big"), start_time_unix_nano=start,
                          end_time_unix_nano=start + 10_000 + j % 97 * 100)
        sp.attributes.extend([kv("eacgm.layer", layer), kv("code.function.name", fn)])
        if layer == "nccl":
            sp.attributes.append(kv("nccl.bytes", 1 << 22))
    return req.SerializeToString()


def ingest_rate(n_batches: int = 60) -> dict:
    """Spans/s through decode + windows + features (in process and over gRPC), windows/s scored."""
    payloads = [batch(i) for i in range(n_batches)]
    n_spans = 2000 * n_batches
    cfg = DetectorConfig(window_s=1.0, grace_s=0.5, warmup_windows=10_000, history_windows=10_000)
    det = Detector(cfg)
    t = time.perf_counter()
    for p in payloads:
        det.add_traces(ExportTraceServiceRequest.FromString(p))
        det.ready()
    det.drain()
    spans_per_s = n_spans / (time.perf_counter() - t)

    svc = DetectorService(DetectorConfig(listen="127.0.0.1:0", window_s=1.0, queue_size=4096,
                                         warmup_windows=10_000, history_windows=10_000)).start()
    with grpc.insecure_channel(f"127.0.0.1:{svc.port}") as ch:
        call = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        t = time.perf_counter()
        for p in payloads:
            call(p, timeout=30)
        svc.wait_idle()
        grpc_rate = n_spans / (time.perf_counter() - t)
    svc.stop()

    rng = np.random.default_rng(0)
    n_feat = 24
    X = rng.normal(size=(2000, n_feat)) @ rng.normal(size=(n_feat, n_feat))
    model = GMMDetector(random_state=0).fit(X)
    t = time.perf_counter()
    for row in X[:1000]:
        # One window at a time, as the online path scores them, plus attribution.
        model.score_samples(row[None])
        model.contributions(row[None])
    return {"spans_per_s": spans_per_s, "grpc_spans_per_s": grpc_rate,
            "windows_per_s": 1000 / (time.perf_counter() - t), "features": n_feat}
