"""A simulated agent: the processes of one host, sending their telemetry as OTLP over gRPC.

Stands in for `otel-eacgm agent` where the scale-out tests need many entities on several hosts
(the real agent traces real processes on this one machine). Each rank is one entity (host.name,
process.pid), with the span and metric shapes of eacgm_testkit.recording; a fault can be put
into chosen windows of chosen ranks. Windows are sent in order, each rank's traces then
metrics, one window every ``--pace-s`` seconds; event times are the recording's (fixed), so
every run sends the same data whatever its pace. At the end it prints what it sent as one JSON
line: {"spans": N, "points": N, "requests": N}.

    python -m eacgm_testkit.sim_agent --endpoint 127.0.0.1:4317 --ranks 0,1 --windows 100 \
        --fault 3:70:74:latency
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import grpc
import numpy as np

from eacgm_testkit.recording import send, window_requests

FAULT_KINDS = ("latency", "gpu", "bandwidth", "errors")


def valid_trace_ids(traces) -> None:  # noqa: ANN001 - ExportTraceServiceRequest
    """Set the first byte of every trace id: the recording numbers traces from zero, and an
    all-zero trace id (rank 0's window 0) is invalid OTLP, refused by receivers."""
    for rs in traces.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                span.trace_id = b"\x01" + span.trace_id[1:]


def parse_fault(text: str) -> tuple[int, range, str]:
    """RANK:FIRST:LAST:KIND (windows FIRST..LAST inclusive) as (rank, windows, kind)."""
    try:
        rank, first, last, kind = text.split(":")
        windows = range(int(first), int(last) + 1)
        rank_no = int(rank)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fault {text!r}: expected RANK:FIRST:LAST:KIND") from None
    if kind not in FAULT_KINDS or not windows:
        raise argparse.ArgumentTypeError(f"--fault {text!r}: KIND is one of {FAULT_KINDS}, FIRST <= LAST")
    return rank_no, windows, kind


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", required=True, help="OTLP gRPC host:port (plaintext)")
    ap.add_argument("--ranks", required=True, help="comma-separated ranks of this host (pid 1000+rank)")
    ap.add_argument("--windows", type=int, required=True, help="1 s windows to send")
    ap.add_argument("--pace-s", type=float, default=0.0, help="pause after each window")
    ap.add_argument("--fault", type=parse_fault, action="append", default=[],
                    help="RANK:FIRST:LAST:KIND, KIND one of " + ", ".join(FAULT_KINDS))
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    ranks = [int(r) for r in args.ranks.split(",")]
    faults = {(rank, w): kind for rank, windows, kind in args.fault for w in windows}
    rngs = {r: np.random.default_rng(args.seed + r) for r in ranks}
    sent = {"spans": 0, "points": 0, "requests": 0}
    with grpc.insecure_channel(args.endpoint) as channel:
        for w in range(args.windows):
            for r in ranks:
                traces, metrics = window_requests(r, w, rngs[r], faults.get((r, w)))
                valid_trace_ids(traces)
                send(channel, traces)
                send(channel, metrics)
                sent["spans"] += sum(len(ss.spans) for rs in traces.resource_spans for ss in rs.scope_spans)
                sent["points"] += sum(1 for rm in metrics.resource_metrics for sm in rm.scope_metrics
                                      for m in sm.metrics for _ in getattr(m, m.WhichOneof("data")).data_points)
                sent["requests"] += 2
            if args.pace_s:
                time.sleep(args.pace_s)
    print(json.dumps(sent), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
