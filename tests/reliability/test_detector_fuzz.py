"""Fuzzing the detector's OTLP gRPC endpoints, over the real server of `otel-eacgm detector serve`.

Over ten thousand cases: random bytes, mutated valid requests, hostile values (extreme
timestamps, bad ids, NaN, odd attribute types), other messages and wire types, attribute floods,
deep nesting, oversized batches. Every answer must be a clear status (OK, INVALID_ARGUMENT,
RESOURCE_EXHAUSTED, or UNAVAILABLE as back-pressure), never UNKNOWN/INTERNAL (an exception in a
handler); the process must survive, its scoring thread must log no exception, and afterwards a
fresh entity must still be windowed, scored and reported.
"""

from __future__ import annotations

import collections
import random
import time

import grpc
import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

import otlp_fuzz
from detector_models import write_model
from detector_proc import DetectorProcess

SEED = 20261203
CASES = {"random_bytes": 2500, "mutated": 3500, "hostile_values": 2500, "wrong_message": 1500,
         "attribute_flood": 60, "deep_nesting": 60}
CLEAR = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAVAILABLE,
         grpc.StatusCode.RESOURCE_EXHAUSTED}
MAX_REQUEST = 4 * 1024 * 1024
IN_FLIGHT = 16


def _code(call) -> grpc.StatusCode:  # noqa: ANN001 - a grpc future
    try:
        call.result()
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()


@pytest.fixture
def fuzzed_detector(counter, tmp_path):  # noqa: ANN001, ANN201
    # A fixed model (no warm-up fits): the fuzz is about decoding, windowing, scoring and
    # emitting hostile input, and an online fit per fuzzed entity would only slow it down.
    _, sink_port = counter
    det = DetectorProcess(tmp_path, export_endpoint=f"127.0.0.1:{sink_port}", window_s=1.0, grace_s=0.0,
                          max_request_bytes=MAX_REQUEST, model_path=str(write_model(tmp_path / "m.npz"))).start()
    yield det
    if det.alive():
        det.stop()


def test_ten_thousand_hostile_requests_get_clear_answers_and_scoring_survives(fuzzed_detector, counter) -> None:  # noqa: ANN001
    sink, _ = counter
    det = fuzzed_detector
    rng = random.Random(SEED)
    seen: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    bad: list[str] = []
    started = time.monotonic()
    with grpc.insecure_channel(det.address, options=[("grpc.max_send_message_length", -1)]) as ch:
        methods = {name: ch.unary_unary(path) for name, path in otlp_fuzz.SERVICES.items()}
        pending: collections.deque = collections.deque()
        services: dict[int, str] = {}
        payloads: dict[int, bytes] = {}

        def settle(limit: int) -> None:
            while len(pending) > limit:
                category, index, call = pending.popleft()
                code = _code(call)
                for attempt in range(200):  # retry back-pressure like an OTLP exporter, so each case is scored
                    if code is not grpc.StatusCode.UNAVAILABLE:
                        break
                    time.sleep(min(0.005 * 2**attempt, 0.2))
                    call = methods[services[index]].future(payloads[index], timeout=30)
                    code = _code(call)
                payloads.pop(index, None)
                seen[category][code.name] += 1
                if code not in CLEAR:
                    bad.append(f"{category} case {index} (seed {SEED}): {code.name} {call.exception().details()!r}")

        index = 0
        for category, n in CASES.items():
            for _ in range(n):
                service, payload = otlp_fuzz.case(rng, category)
                services[index], payloads[index] = service, payload
                pending.append((category, index, methods[service].future(payload, timeout=30)))
                index += 1
                settle(IN_FLIGHT)
        settle(0)
        # Oversized: over max_request_bytes (the handler's check), and over gRPC's own limit (2x).
        for spans in (30000, 30000, 120000):
            payload = otlp_fuzz.huge_batch(spans)
            assert len(payload) > MAX_REQUEST
            services[index], payloads[index] = "traces", payload
            pending.append(("huge_batch", index, methods["traces"].future(payload, timeout=60)))
            index += 1
        under = otlp_fuzz.huge_batch(8000)
        assert len(under) < MAX_REQUEST
        services[index], payloads[index] = "traces", under
        pending.append(("large_batch_under_limit", index, methods["traces"].future(under, timeout=60)))
        settle(0)
        fuzz_s = time.monotonic() - started
        total = sum(sum(c.values()) for c in seen.values())
        print(f"detector fuzz: {total} cases in {fuzz_s:.1f}s: " +
              "; ".join(f"{k} {dict(v)}" for k, v in seen.items()))
        assert total >= 10000
        assert not bad, "\n".join(bad[:20])
        assert seen["huge_batch"] == {"RESOURCE_EXHAUSTED": 3}
        assert seen["large_batch_under_limit"] == {"OK": 1}
        assert seen["random_bytes"]["INVALID_ARGUMENT"] > 1000  # the generator does produce garbage
        assert seen["hostile_values"]["OK"] > 1000  # and accepted, windowed values, not just refusals
        assert sum(c["UNAVAILABLE"] for c in seen.values()) == 0  # every case was processed in the end

        # The scoring thread survived: a fresh entity's windows are still scored and reported.
        base = time.time_ns() // 10**9 * 10**9 - 30 * 10**9
        for w in range(16):
            req = otlp_fuzz.traces(random.Random(w), spans=50)
            for rs in req.resource_spans:
                del rs.resource.attributes[:]
                rs.resource.attributes.append(KeyValue(key="host.name", value=AnyValue(string_value="after-fuzz")))
                for sp in rs.scope_spans[0].spans:
                    sp.start_time_unix_nano = base + w * 10**9 + random.Random(w).randrange(10**8)
                    sp.end_time_unix_nano = sp.start_time_unix_nano + 10**5
            for _ in range(50):
                if _code(methods["traces"].future(req.SerializeToString(), timeout=30)) is grpc.StatusCode.OK:
                    break
                time.sleep(0.1)
    assert sink.wait_for(lambda: any(p["entity"].get("host.name") == "after-fuzz" for p in sink.detector_scores), 30), \
        det.log()[-3000:]
    assert det.alive(), det.log()[-3000:]
    assert det.stop() == 0
    log = det.log()
    assert "Traceback" not in log and "failed" not in log.lower(), log[-5000:]
