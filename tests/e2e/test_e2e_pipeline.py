"""The whole pipeline on this machine: examples/cuda_steps.py -> agent (real eBPF) -> real
collector -> detector -> collector -> the tests' OTLP store (Jaeger: test_e2e_jaeger.py).

The workload records every call it makes; at 100 % sampling the spans must match them one for
one. Its first steps are clean (the detector warms up on them); the steps in COMM_FAULT add
extra, larger all-reduces, and the detector must flag the windows they fill.
"""

from __future__ import annotations

import collections

import pytest

from e2e_stack import COMM_FAULT, SERVICE, STEPS, WINDOW_NS, Run

pytestmark = pytest.mark.ebpf
SLACK_NS = 2_000_000  # span durations vs the workload's own clock reads (scheduling)


def window_of(ns: int) -> int:
    """Start of the detector window holding `ns` (windows are aligned to the epoch)."""
    return ns - ns % WINDOW_NS


def expected_calls(run: Run) -> collections.Counter:
    """What the workload says it called, plus its Python `step` function once per step."""
    calls = collections.Counter(step=len(run.steps))
    for rec in run.steps:
        calls.update(rec["calls"])
    return calls


def step_traces(run: Run) -> list[tuple[dict, dict, list[dict]]]:
    """(the workload's record, the root `step` span, the spans under it) per step, in order.

    Paired by order, not by time: the agent's spans and the workload's time.time_ns() are two
    clocks (monotonic converted at the agent's start, and the wall clock, which may be slewed).
    """
    by_trace = collections.defaultdict(list)
    for s in run.spans():
        by_trace[s["trace_id"]].append(s)
    traces = []
    for spans in by_trace.values():
        roots = [s for s in spans if s["name"] == "step"]
        assert len(roots) == 1, f"a trace with {len(roots)} step spans"
        traces.append((roots[0], [s for s in spans if s is not roots[0]]))
    traces.sort(key=lambda t: t[0]["start"])
    records = sorted(run.steps, key=lambda r: r["start"])
    assert len(traces) == len(records), f"{len(traces)} step traces for {len(records)} steps"
    return [(rec, root, children) for rec, (root, children) in zip(records, traces)]


def fault_windows(run: Run) -> set[int]:
    """Windows (in span time, as the detector cuts them) wholly inside the fault: from the first
    faulty step's start to the last one's end."""
    faulty = [(root, children) for rec, root, children in step_traces(run) if rec["comm_fault"]]
    first, last = faulty[0][0]["start"], max(s["end"] for s in [faulty[-1][0], *faulty[-1][1]])
    return {w for w in range(window_of(first) + WINDOW_NS, last, WINDOW_NS) if w + WINDOW_NS <= last}


def test_every_call_is_one_span_nothing_lost(e2e_run: Run) -> None:
    assert [r["step"] for r in e2e_run.steps] == list(range(1, STEPS + 1))
    assert [r["step"] for r in e2e_run.steps if r["comm_fault"]] == list(COMM_FAULT)
    spans = e2e_run.spans()
    expected = expected_calls(e2e_run)
    assert collections.Counter(s["name"] for s in spans) == expected
    assert len({s["span_id"] for s in spans}) == len(spans), "a span arrived twice"
    assert all(s["resource"]["service.name"] == SERVICE for s in spans)
    c = e2e_run.agent_counters
    assert c["calls"] == c["exported"] == sum(expected.values())
    assert c["dropped_export"] == c["dropped_ringbuf"] == c["export_failures"] == 0
    assert f"'spans.accepted': {sum(expected.values())}" in e2e_run.detector_log, e2e_run.detector_log[-2000:]


def test_each_step_is_one_trace_rooted_at_its_python_span(e2e_run: Run) -> None:
    pairs = step_traces(e2e_run)
    assert len(pairs) == STEPS
    for rec, root, children in pairs:
        assert root["parent_span_id"] == "" and root["attributes"]["eacgm.layer"] == "python"
        assert root["attributes"]["code.function.name"] == "cuda_steps.step"
        assert root["end"] - root["start"] <= rec["end"] - rec["start"] + SLACK_NS, rec["step"]
        assert all(s["parent_span_id"] == root["span_id"] for s in children)
        assert all(root["start"] <= s["start"] <= s["end"] <= root["end"] for s in children), rec["step"]
        # the calls of this very step: fault steps' extra all-reduces pin the pairing
        assert collections.Counter(s["name"] for s in children) == collections.Counter(rec["calls"]), rec["step"]


def test_call_metrics_count_every_call(e2e_run: Run) -> None:
    points = [p for p in e2e_run.store.metric_points()
              if p["name"] == "eacgm.calls" and p["attributes"].get("process.pid") == e2e_run.pid]
    final: dict[str, int] = {}
    for p in points:  # cumulative counters: the last export holds the totals
        fn = p["attributes"]["code.function.name"]
        final[fn] = max(final.get(fn, 0), p["value"])
    expected = expected_calls(e2e_run)
    expected["cuda_steps.step"] = expected.pop("step")  # Python functions count by module-qualified name
    assert final == dict(expected)


def test_injected_fault_is_flagged(e2e_run: Run) -> None:
    events = e2e_run.anomaly_events()
    flagged = {e["attributes"]["eacgm.anomaly.window.start"]: e for e in events}
    faulty = fault_windows(e2e_run)
    assert len(faulty) >= 3, "the fault should fill several windows"
    missed = faulty - set(flagged)
    assert not missed, f"fault windows not flagged: {sorted(missed)}; flagged: {sorted(flagged)}"
    trace_ids = {s["trace_id"] for s in e2e_run.spans()}
    for w in faulty:
        e = flagged[w]
        a = e["attributes"]
        assert e["severity_text"] == "WARN" and e["resource"]["service.name"] == "otel-eacgm-detector"
        assert a["eacgm.anomaly.score"] < a["eacgm.anomaly.threshold"]
        assert a["eacgm.anomaly.window.end"] == w + WINDOW_NS
        # the slowdown shows in the all-reduce spans' features and, since the call statistics carry
        # the process' resource (issue 28), in its NCCL metric features (nccl.bytes of AllReduce)
        assert any("ncclAllReduce" in f or f.startswith("metric.nccl.") for f in a["eacgm.anomaly.features"]), \
            a["eacgm.anomaly.features"]
        assert "communication" in a["eacgm.anomaly.categories"]
        assert e["trace_id"] in trace_ids and set(a["eacgm.anomaly.trace_ids"]) <= trace_ids
        assert f"process.pid={e2e_run.pid}" in e["body"]


def test_clean_windows_score_above_fault_windows(e2e_run: Run) -> None:
    points = [p for p in e2e_run.store.metric_points()
              if p["name"] == "eacgm.anomaly.score" and p["resource"].get("process.pid") == str(e2e_run.pid)]
    score = {p["time"] - WINDOW_NS: p["value"] for p in points}
    faulty = fault_windows(e2e_run)
    fault_start = min(root["start"] for rec, root, _ in step_traces(e2e_run) if rec["comm_fault"])
    clean = [s for w, s in score.items() if w + WINDOW_NS <= fault_start]
    assert clean, "no window was scored before the fault: the warm-up outlasted the clean steps"
    # Not every clean window must pass (a threshold fitted on 16 windows is coarse), but the
    # fault must score far below the typical clean window.
    clean.sort()
    assert max(score[w] for w in faulty) < clean[len(clean) // 2] - 10


def test_spans_carry_their_windows_verdict(e2e_run: Run) -> None:
    verdicts = collections.defaultdict(set)
    for s in e2e_run.spans():
        a = s["attributes"]
        verdicts[window_of(s["start"])].add((a.get("eacgm.anomaly"), a.get("eacgm.anomaly.score")))
    assert all(len(v) == 1 for v in verdicts.values()), "spans of one window disagree"
    verdict = {w: v.pop() for w, v in verdicts.items()}
    ordered = sorted(verdict)
    warmup = [w for w in ordered if verdict[w][0] is None]
    # warmup_windows (tests/fixtures/detector-e2e.yaml): the entity has spans in every window
    assert warmup == ordered[:16], "the 16 warm-up windows come first, unannotated"
    events = {e["attributes"]["eacgm.anomaly.window.start"] for e in e2e_run.anomaly_events()}
    assert {w for w, (flag, _) in verdict.items() if flag} == events & set(verdict)
    points = {p["time"] - WINDOW_NS: p["value"] for p in e2e_run.store.metric_points()
              if p["name"] == "eacgm.anomaly.score" and p["resource"].get("process.pid") == str(e2e_run.pid)}
    assert {w: s for w, (flag, s) in verdict.items() if flag is not None} == \
        {w: s for w, s in points.items() if w in verdict}
    # Windows of the process without spans: only after its last span, where the call statistics
    # the agent reads at exit land (they carry the process' resource since issue 28, so the
    # detector scores them as the process' own window; such a window has no span features).
    last = window_of(max(s["end"] for s in e2e_run.spans()))
    assert all(w >= last for w in (events | set(points)) - set(verdict)), \
        (sorted((events | set(points)) - set(verdict)), last)
