"""More entities over time than the detector's table holds, over the real `detector serve`.

The process id is part of the entity, so every restart of a traced process is a new entity: a
table that only fills up would, after max_entities restarts, drop every new process for good.
"""

from __future__ import annotations

import ast
import random
import time

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from detector_models import write_model
from detector_proc import DetectorProcess

SEC = 10**9
MAX_ENTITIES = 4


def _request(pid: int, windows: range, base_ns: int) -> ExportTraceServiceRequest:
    """20 launches of process `pid` in each of `windows` (1 s each from base_ns)."""
    rng = random.Random(pid)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend([KeyValue(key="host.name", value=AnyValue(string_value="node")),
                                   KeyValue(key="process.pid", value=AnyValue(int_value=pid))])
    ss = rs.scope_spans.add()
    for w in windows:
        for _ in range(20):
            start = base_ns + w * SEC + rng.randrange(SEC // 2)
            sp = ss.spans.add(name="cudaLaunchKernel", trace_id=rng.randbytes(16), span_id=rng.randbytes(8),
                              start_time_unix_nano=start, end_time_unix_nano=start + 10**4)
            sp.attributes.append(KeyValue(key="eacgm.layer", value=AnyValue(string_value="cuda.runtime")))
    return req


def _counters(log: str) -> dict[str, int]:
    line = [x for x in log.splitlines() if "detector stopped: " in x][-1]
    return ast.literal_eval(line.split("detector stopped: ", 1)[1])


def test_restarted_processes_replace_idle_ones_and_the_warning_is_rate_limited(
        counter, tmp_path) -> None:  # noqa: ANN001
    sink, sink_port = counter
    det = DetectorProcess(tmp_path, export_endpoint=f"127.0.0.1:{sink_port}", window_s=1.0, grace_s=0.0,
                          max_entities=MAX_ENTITIES, model_path=str(write_model(tmp_path / "m.npz", window_s=1.0))).start()
    base_ns = (time.time_ns() // SEC - 600) * SEC
    residents, newcomers, crowded_out = range(100, 100 + MAX_ENTITIES), range(200, 212), 999
    try:
        with grpc.insecure_channel(det.address) as ch:
            export = TraceServiceStub(ch).Export
            # The table is full of processes that are sending: a new one is dropped (and counted).
            for j in range(10):
                for pid in residents:
                    export(_request(pid, range(j, j + 1), base_ns), timeout=10)
                if j >= 2:
                    export(_request(crowded_out, range(4), base_ns), timeout=10)
                time.sleep(0.2)
            # They stop (exited); new processes come one after another, more than the table holds.
            time.sleep(1.5)
            for pid in newcomers:
                export(_request(pid, range(4), base_ns), timeout=10)
                time.sleep(0.5)
        # Each newcomer's 3 closed windows are scored at once, its last when it is evicted or at exit.
        scored = lambda pid: sum(p["entity"].get("process.pid") == str(pid) for p in sink.detector_scores)  # noqa: E731
        assert sink.wait_for(lambda: all(scored(pid) >= 3 for pid in newcomers), 30), \
            ({pid: scored(pid) for pid in newcomers}, det.log()[-3000:])
    finally:
        assert det.stop() == 0
    assert all(scored(pid) == 4 for pid in newcomers), {pid: scored(pid) for pid in newcomers}
    assert scored(crowded_out) == 0
    log = det.log()
    warnings = [x for x in log.splitlines() if "max_entities" in x]
    assert len(warnings) == 1, warnings  # 8 dropped batches, one line a minute at most
    counters = _counters(log)
    assert counters["spans.dropped_entities"] == 8 * 4 * 20
    assert counters["entities.evicted"] == len(newcomers)  # the 4 residents, then the 8 oldest newcomers
