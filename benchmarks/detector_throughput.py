"""Detector throughput and memory in one process, medians of repeated runs.

- spans/s ingested: OTLP trace requests decoded, windowed and turned into features, in process
  (``Detector.add_traces``) and end to end over gRPC (``DetectorService``, one client);
- windows/s scored: one window at a time, as the online path scores them: context features
  from the entity's recent windows, vectorized, scored, with attribution;
- memory: peak RSS of this process and Python heap growth while a detector ingests a long run
  of many entities (it must stay flat: windows close, history is capped).

    .venv/bin/python benchmarks/detector_throughput.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
import tracemalloc

import grpc
import numpy as np
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from eacgm_detector.config import DetectorConfig
from eacgm_detector.emit import kv
from eacgm_detector.context import ContextTracker
from eacgm_detector.features import vectorize
from eacgm_detector.online import _top_features, fit_rows
from eacgm_detector.pipeline import Detector
from eacgm_detector.service import DetectorService

T0 = 1_760_000_000 * 10**9
FUNCS = [("cuda.runtime", "cudaLaunchKernel"), ("cuda.runtime", "cudaMemcpyAsync"),
         ("nccl", "ncclAllReduce"), ("torch", "aten::addmm")]
SPANS_PER_BATCH = 2000
TRACE_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def batch(i: int, *, pid: int = 1, n: int = SPANS_PER_BATCH, per_s: int = 20000) -> bytes:
    """A serialized request of ``n`` spans, batch ``i`` of a steady ``per_s`` spans/s run."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend([kv("host.name", "bench"), kv("process.pid", pid)])
    ss = rs.scope_spans.add()
    # Durations vary from window to window, as real ones do (identical windows would be
    # duplicate points to the model).
    jitter = np.random.default_rng(i * 7919 + pid).integers(0, 20_000, n)
    for j in range(n):
        layer, fn = FUNCS[j % len(FUNCS)]
        start = T0 + (i * n + j) * (10**9 // per_s)
        sp = ss.spans.add(name=fn, trace_id=(i * n + j + 1).to_bytes(16, "big"),
                          span_id=(j + 1).to_bytes(8, "big"), start_time_unix_nano=start,
                          end_time_unix_nano=start + 10_000 + int(jitter[j]))
        sp.attributes.extend([kv("eacgm.layer", layer), kv("code.function.name", fn)])
        if layer == "nccl":
            sp.attributes.append(kv("nccl.bytes", 1 << 22))
    return req.SerializeToString()


def _config(**kw) -> DetectorConfig:
    # Warm-up longer than the run: ingestion is measured without model fits in the way.
    return DetectorConfig(**(dict(window_s=1.0, grace_s=0.5, warmup_windows=10_000,
                                  history_windows=10_000) | kw))


def spans_in_process(payloads: list[bytes]) -> float:
    det = Detector(_config())
    t = time.perf_counter()
    for p in payloads:
        det.add_traces(ExportTraceServiceRequest.FromString(p))
        det.ready()
    det.drain()
    return len(payloads) * SPANS_PER_BATCH / (time.perf_counter() - t)


def spans_over_grpc(payloads: list[bytes]) -> float:
    svc = DetectorService(_config(listen="127.0.0.1:0", queue_size=4096)).start()
    with grpc.insecure_channel(f"127.0.0.1:{svc.port}") as ch:
        call = ch.unary_unary(TRACE_EXPORT)
        t = time.perf_counter()
        for p in payloads:
            call(p, timeout=30)
        svc.wait_idle()
        rate = len(payloads) * SPANS_PER_BATCH / (time.perf_counter() - t)
    svc.stop()
    return rate


def windows_scored(n_feat: int = 24, n: int = 1000) -> float:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, n_feat)) @ rng.normal(size=(n_feat, n_feat))
    rows = [{f"metric.m{j}.mean": float(v) for j, v in enumerate(x)} for x in X]
    cfg = DetectorConfig()
    tracker = ContextTracker(cfg.context_windows)
    model = fit_rows(cfg, [tracker.augment(r) for r in rows[:2000]])
    t = time.perf_counter()
    for r in rows[2000:2000 + n]:
        x = vectorize([tracker.augment(r)], model.feature_names)
        model.detector.score_samples(x)
        _top_features(model, x, cfg.top_features)
    return n / (time.perf_counter() - t)


def heap_growth(n_entities: int = 50, n_windows: int = 400) -> tuple[float, float]:
    """Python heap (MiB) after a quarter and after all of a long many-entity run."""
    det = Detector(DetectorConfig(window_s=1.0, grace_s=0.5, warmup_windows=50, refit_every=100,
                                  history_windows=200, max_components=2))
    tracemalloc.start()
    marks = []
    for w in range(n_windows):
        for e in range(n_entities):
            det.add_traces(ExportTraceServiceRequest.FromString(batch(w, pid=e, n=40, per_s=40)))
        det.ready()
        if w + 1 in (n_windows // 4, n_windows):
            marks.append(tracemalloc.get_traced_memory()[0] / 2**20)
    tracemalloc.stop()
    return marks[0], marks[1]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    payloads = [batch(i) for i in range(60)]
    runs = {"spans/s ingested, in process (decode + window + features)": spans_in_process,
            "spans/s ingested over gRPC (one client, service + scoring thread)": spans_over_grpc}
    print("| figure | median | min | max |\n|---|---:|---:|---:|")
    for name, fn in runs.items():
        vals = [fn(payloads) for _ in range(args.repeats)]
        print(f"| {name} | {statistics.median(vals):.0f} | {min(vals):.0f} | {max(vals):.0f} |")
    vals = [windows_scored() for _ in range(args.repeats)]
    print(f"| windows/s scored (24 features and their 48 context features, one at a time, with attribution) | "
          f"{statistics.median(vals):.0f} | {min(vals):.0f} | {max(vals):.0f} |")
    quarter, full = heap_growth()
    print(f"\nPython heap while 50 entities stream 400 windows each: {quarter:.1f} MiB after 100 "
          f"windows, {full:.1f} MiB after 400")
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
