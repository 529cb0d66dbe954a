"""The end-to-end run's traces in the real Jaeger (v1.75.0, scripts/build-jaeger.sh): found by the
detector's annotation through Jaeger's query API, whole trees by id, and rendered by Jaeger's
UI in headless Chromium.

Jaeger built from the Go module proxy has its query API but no UI: the UI is a separate npm
build (jaeger-ui) and the binary serves a placeholder page instead. Jaeger serves a UI build
from a directory named by EACGM_JAEGER_UI_ASSETS (collector-config/jaeger-local.yaml); without
one the UI test is skipped, saying so.
"""

from __future__ import annotations

import time
import urllib.request

import pytest

from e2e_stack import SERVICE, Run
from headless_chromium import checked_screenshot, dump_dom
from jaeger_api import find_traces, get_trace, tags_of

pytestmark = pytest.mark.ebpf
SCREEN = (1600, 900)
PLACEHOLDER = "This is not the Jaeger UI you are looking for"  # Jaeger's page when it has no UI


def flagged_trace(run: Run) -> str:
    """The trace the most anomalous window's event points at (its slowest affected span's)."""
    events = run.anomaly_events()
    assert events, "the detector flagged nothing"
    return min(events, key=lambda e: e["attributes"]["eacgm.anomaly.score"])["trace_id"]


def test_search_by_the_anomaly_tag_finds_the_flagged_traces(e2e_run: Run) -> None:
    spans = e2e_run.spans()
    flagged = {s["trace_id"] for s in spans if s["attributes"].get("eacgm.anomaly") is True}
    assert flagged
    start, end = min(s["start"] for s in spans), max(s["end"] for s in spans)

    def search(tags: dict[str, str]) -> set[str]:
        return {t["traceID"] for t in find_traces(e2e_run.jaeger_ui, SERVICE, tags=tags, start_ns=start, end_ns=end)}

    # Jaeger gets the spans on the Collector's own export schedule, after the test's store did
    deadline = time.monotonic() + 20
    while search({"eacgm.anomaly": "true"}) != flagged and time.monotonic() < deadline:
        time.sleep(0.5)
    assert search({"eacgm.anomaly": "true"}) == flagged
    assert search({}) == {s["trace_id"] for s in spans}, "Jaeger lost or invented traces"


def test_trace_tree_by_id(e2e_run: Run) -> None:
    trace_id = flagged_trace(e2e_run)
    trace = get_trace(e2e_run.jaeger_ui, trace_id)
    sent = {s["span_id"]: s for s in e2e_run.spans() if s["trace_id"] == trace_id}
    got = {s["spanID"]: s for s in trace["spans"]}
    assert set(got) == set(sent)
    roots = [s for s in got.values() if not s["references"]]
    assert [r["operationName"] for r in roots] == ["step"]
    root = roots[0]
    for span_id, span in got.items():
        assert span["operationName"] == sent[span_id]["name"]
        assert trace["processes"][span["processID"]]["serviceName"] == SERVICE
        assert tags_of(span).get("eacgm.anomaly") is True, "a flagged trace's spans carry the verdict"
        if span is not root:
            assert span["references"] == [{"refType": "CHILD_OF", "traceID": trace_id, "spanID": root["spanID"]}]
            assert sent[span_id]["parent_span_id"] == root["spanID"]
            assert root["startTime"] <= span["startTime"] <= root["startTime"] + root["duration"]
    assert sum(s["operationName"] == "ncclAllReduce" for s in got.values()) > 1, "a fault step: extra all-reduces"


def test_jaeger_ui_renders_the_trace(e2e_run: Run) -> None:
    with urllib.request.urlopen(f"{e2e_run.jaeger_ui}/", timeout=10) as resp:
        if PLACEHOLDER in resp.read().decode():
            pytest.skip("this Jaeger build has no UI (the Go module proxy serves Jaeger's Go code, not its npm-built "
                        "UI): set EACGM_JAEGER_UI_ASSETS to a jaeger-ui build directory")
    trace_id = flagged_trace(e2e_run)
    url = f"{e2e_run.jaeger_ui}/trace/{trace_id}"
    dom = dump_dom(url)
    for text in ("step", "ncclAllReduce", "cudaLaunchKernel", SERVICE, trace_id[:7]):
        assert text in dom, f"{text!r} not in the rendered page {url}"
    png = e2e_run.log_dir / "jaeger-trace.png"
    checked_screenshot(url, png, SCREEN)
