"""A synthetic recorded training run as OTLP requests, with injectable anomalies (the detector
tests and the simulated agents of eacgm_testkit.sim_agent replay it).

Each 1-second window of one rank carries CUDA launches, NCCL all-reduces and torch ops as
spans, and GPU utilization, power and a cumulative network counter as metrics, with the
attribute names the agent emits. ``anomalies`` maps a window index to "latency", "gpu",
"bandwidth" or "errors"; those windows get a 5x slower kernel launch, a GPU utilization
and power collapse, a 6x slower all-reduce for the same bytes, or failing all-reduces.
"""

from __future__ import annotations

import time

import grpc
import numpy as np
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import MetricsServiceStub
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from eacgm_detector.emit import kv

T0 = 1_760_000_000 * 10**9  # event time of window 0, fixed so replays are identical
SEC = 10**9


def resource_attrs(rank: int) -> list:
    return [kv("service.name", "train"), kv("host.name", f"node{rank // 2}"),
            kv("process.pid", 1000 + rank)]


def window_requests(rank: int, w: int, rng: np.random.Generator, anomaly: str | None = None):
    """(traces, metrics) requests for window ``w`` of ``rank``."""
    t0 = T0 + w * SEC
    tr = ExportTraceServiceRequest()
    rs = tr.resource_spans.add()
    rs.resource.attributes.extend(resource_attrs(rank))
    ss = rs.scope_spans.add()
    ss.scope.name = "otel_eacgm"
    plan = [("cuda.runtime", "cudaLaunchKernel", 40, np.log(2e-5), None),
            ("nccl", "ncclAllReduce", 8, np.log(1e-3), 4 << 20),
            ("torch", "aten::addmm", 15, np.log(3e-4), None)]
    n_span = 0
    for layer, fn, lam, mu, nbytes in plan:
        if anomaly == "latency" and fn == "cudaLaunchKernel":
            mu += np.log(5.0)
        if anomaly == "bandwidth" and fn == "ncclAllReduce":
            mu += np.log(6.0)
        for _ in range(rng.poisson(lam)):
            n_span += 1
            start = t0 + int(rng.integers(0, SEC - 10**7))
            dur = float(np.exp(rng.normal(mu, 0.3)))
            sp = ss.spans.add(name=fn, trace_id=(rank * 10**6 + w).to_bytes(16, "big"),
                              span_id=(n_span + w * 1000).to_bytes(8, "big"),
                              start_time_unix_nano=start, end_time_unix_nano=start + int(dur * 1e9))
            sp.attributes.extend([kv("eacgm.layer", layer), kv("code.function.name", fn)])
            if nbytes:
                sp.attributes.append(kv("nccl.bytes", nbytes))
            if anomaly == "errors" and fn == "ncclAllReduce":
                sp.status.code = Status.STATUS_CODE_ERROR
    mt = ExportMetricsServiceRequest()
    rm = mt.resource_metrics.add()
    rm.resource.attributes.extend(resource_attrs(rank))
    sm = rm.scope_metrics.add()
    util = 0.15 if anomaly == "gpu" else 0.8
    for k in range(2):
        ts = t0 + (k + 1) * SEC // 3
        g = sm.metrics.add(name="hw.gpu.utilization", unit="1")
        g.gauge.data_points.add(time_unix_nano=ts, as_double=float(rng.normal(util, 0.03)))
        p = sm.metrics.add(name="hw.power", unit="W")
        p.gauge.data_points.add(time_unix_nano=ts, as_double=float(rng.normal(250 if anomaly != "gpu" else 90, 8)))
        n = sm.metrics.add(name="system.network.io", unit="By")
        n.sum.is_monotonic = True
        n.sum.aggregation_temporality = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
        # A steady 100 MB/s transmit counter, read with a little jitter.
        dp = n.sum.data_points.add(time_unix_nano=ts, as_int=int((ts - T0) / SEC * 1e8 + rng.normal(0, 2e5)))
        dp.attributes.append(kv("network.io.direction", "transmit"))
    return tr, mt


def recording(ranks: list[int], n_windows: int, anomalies: dict[int, str] | None = None, seed: int = 7):
    """Requests in arrival order: per window, each rank's traces then metrics."""
    rngs = {r: np.random.default_rng(seed + r) for r in ranks}
    out = []
    for w in range(n_windows):
        for r in ranks:
            out.extend(window_requests(r, w, rngs[r], (anomalies or {}).get(w)))
    return out


def send(channel, req, give_up_s: float = 60.0):
    """Export like an OTLP exporter: retry UNAVAILABLE (back-pressure) with exponential back-off."""
    stub = (TraceServiceStub if isinstance(req, ExportTraceServiceRequest) else MetricsServiceStub)(channel)
    deadline, delay = time.monotonic() + give_up_s, 0.005
    while True:
        try:
            return stub.Export(req, timeout=10)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 0.2)
