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
SLACK_NS = 2_000_000  # span timestamps vs the workload's own clock reads (scheduling)


def workload_spans(run: Run) -> list[dict]:
    return [s for s in run.store.spans() if s["resource"].get("process.pid") == run.pid]


def window_of(ns: int) -> int:
    """Start of the detector window holding `ns` (windows are aligned to the epoch)."""
    return ns - ns % WINDOW_NS


def expected_calls(run: Run) -> collections.Counter:
    """What the workload says it called, plus its Python `step` function once per step."""
    calls = collections.Counter(step=len(run.steps))
    for rec in run.steps:
        calls.update(rec["calls"])
    return calls


def anomaly_events(run: Run) -> list[dict]:
    return [r for r in run.store.log_records()
            if r["event_name"] == "eacgm.anomaly" and r["attributes"].get("process.pid") == str(run.pid)]


def fault_windows(run: Run) -> set[int]:
    """Windows that lie wholly inside the fault: from the first faulty step's start to the last one's end."""
    faulty = [r for r in run.steps if r["comm_fault"]]
    first, last = faulty[0]["start"], faulty[-1]["end"]
    return {w for w in range(window_of(first) + WINDOW_NS, last, WINDOW_NS) if w + WINDOW_NS <= last}


def test_every_call_is_one_span_nothing_lost(e2e_run: Run) -> None:
    assert len(e2e_run.steps) == STEPS and [r["step"] for r in e2e_run.steps] == list(range(1, STEPS + 1))
    spans = workload_spans(e2e_run)
    expected = expected_calls(e2e_run)
    assert collections.Counter(s["name"] for s in spans) == expected
    assert len({s["span_id"] for s in spans}) == len(spans), "a span arrived twice"
    assert all(s["resource"]["service.name"] == SERVICE for s in spans)
    c = e2e_run.agent_counters
    assert c["calls"] == c["exported"] == sum(expected.values())
    assert c["dropped_export"] == c["dropped_ringbuf"] == c["export_failures"] == 0
    assert f"'spans.accepted': {sum(expected.values())}" in e2e_run.detector_log, e2e_run.detector_log[-2000:]


def test_each_step_is_one_trace_rooted_at_its_python_span(e2e_run: Run) -> None:
    by_trace = collections.defaultdict(list)
    for s in workload_spans(e2e_run):
        by_trace[s["trace_id"]].append(s)
    assert len(by_trace) == STEPS
    records = sorted(e2e_run.steps, key=lambda r: r["start"])
    roots = sorted(((next(s for s in spans if s["name"] == "step"), spans) for spans in by_trace.values()),
                   key=lambda pair: pair[0]["start"])
    for rec, (root, spans) in zip(records, roots):
        assert root["parent_span_id"] == "" and root["attributes"]["eacgm.layer"] == "python"
        assert rec["start"] - SLACK_NS <= root["start"] <= root["end"] <= rec["end"] + SLACK_NS
        children = [s for s in spans if s is not root]
        assert all(s["parent_span_id"] == root["span_id"] for s in children)
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
    events = anomaly_events(e2e_run)
    flagged = {e["attributes"]["eacgm.anomaly.window.start"]: e for e in events}
    faulty = fault_windows(e2e_run)
    assert len(faulty) >= 3, "the fault should fill several windows"
    missed = faulty - set(flagged)
    assert not missed, f"fault windows not flagged: {sorted(missed)}; flagged: {sorted(flagged)}"
    trace_ids = {s["trace_id"] for s in workload_spans(e2e_run)}
    for w in faulty:
        e = flagged[w]
        a = e["attributes"]
        assert e["severity_text"] == "WARN" and e["resource"]["service.name"] == "otel-eacgm-detector"
        assert a["eacgm.anomaly.score"] < a["eacgm.anomaly.threshold"]
        assert a["eacgm.anomaly.window.end"] == w + WINDOW_NS
        assert any("ncclAllReduce" in f for f in a["eacgm.anomaly.features"]), a["eacgm.anomaly.features"]
        assert "communication" in a["eacgm.anomaly.categories"]
        assert e["trace_id"] in trace_ids and set(a["eacgm.anomaly.trace_ids"]) <= trace_ids
        assert f"process.pid={e2e_run.pid}" in e["body"]


def test_clean_windows_score_above_fault_windows(e2e_run: Run) -> None:
    points = [p for p in e2e_run.store.metric_points()
              if p["name"] == "eacgm.anomaly.score" and p["resource"].get("process.pid") == str(e2e_run.pid)]
    score = {p["time"] - WINDOW_NS: p["value"] for p in points}
    faulty = fault_windows(e2e_run)
    fault_start = min(r["start"] for r in e2e_run.steps if r["comm_fault"])
    clean = [s for w, s in score.items() if w + WINDOW_NS <= fault_start]
    assert clean, "no window was scored before the fault: the warm-up outlasted the clean steps"
    # Not every clean window must pass (a threshold fitted on 16 windows is coarse), but the
    # fault must score far below the typical clean window.
    clean.sort()
    assert max(score[w] for w in faulty) < clean[len(clean) // 2] - 10


def test_spans_carry_their_windows_verdict(e2e_run: Run) -> None:
    verdicts = collections.defaultdict(set)
    for s in workload_spans(e2e_run):
        a = s["attributes"]
        verdicts[window_of(s["start"])].add((a.get("eacgm.anomaly"), a.get("eacgm.anomaly.score")))
    assert all(len(v) == 1 for v in verdicts.values()), "spans of one window disagree"
    verdict = {w: v.pop() for w, v in verdicts.items()}
    ordered = sorted(verdict)
    warmup = [w for w in ordered if verdict[w][0] is None]
    # warmup_windows (tests/fixtures/detector-e2e.yaml): the entity has spans in every window
    assert warmup == ordered[:16], "the 16 warm-up windows come first, unannotated"
    assert {w for w, (flag, _) in verdict.items() if flag} == {e["attributes"]["eacgm.anomaly.window.start"]
                                                               for e in anomaly_events(e2e_run)}
    points = {p["time"] - WINDOW_NS: p["value"] for p in e2e_run.store.metric_points()
              if p["name"] == "eacgm.anomaly.score" and p["resource"].get("process.pid") == str(e2e_run.pid)}
    assert {w: s for w, (flag, s) in verdict.items() if flag is not None} == points
