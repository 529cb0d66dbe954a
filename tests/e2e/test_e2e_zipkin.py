"""The end-to-end run's traces in a real trace UI: Zipkin Lens (io.zipkin:zipkin-server:3.5.1
from Maven Central, scripts/fetch-zipkin.sh), fed by the Collector's zipkin exporter, opened in
headless Chromium: the search for the detector's verdict lists the flagged traces, and a flagged
trace's tree shows the nesting of the span data, the Python step over its CUDA runtime and NCCL
calls. Lens shows span names in lower case (Zipkin's convention).

The screenshot goes to the run's folder, and to docs/screenshots/ (the README shows it) when
EACGM_DOCS_SCREENSHOTS=1, so a test run leaves the checkout as it was.
"""

from __future__ import annotations

import time

import pytest

from collector_build import REPO
from e2e_stack import SERVICE, Run
from headless_chromium import checked_screenshot, dump_dom
from zipkin_lens import listed_traces, search_url, trace_url, tree_rows

pytestmark = pytest.mark.ebpf
SCREEN = (1400, 900)
DOCS_SHOT = REPO / "docs/screenshots/zipkin-lens-flagged-trace.png"


def lens_flagged_traces(run: Run) -> list[str]:
    """The traces Lens lists for a search of the workload's spans tagged eacgm.anomaly=true
    (Zipkin gets the spans on the Collector's export schedule: searched until they are there)."""
    end = max(s["end"] for s in run.spans()) + 60 * 10**9
    deadline = time.monotonic() + 60
    while True:
        listed = listed_traces(dump_dom(search_url(run.zipkin_ui, SERVICE, "eacgm.anomaly=true", end)))
        if listed or time.monotonic() > deadline:
            return listed
        time.sleep(2)


def test_lens_lists_exactly_flagged_traces(e2e_run: Run) -> None:
    spans = e2e_run.spans()
    flagged = {s["trace_id"] for s in spans if s["attributes"].get("eacgm.anomaly") is True}
    listed = set(lens_flagged_traces(e2e_run)) & {s["trace_id"] for s in spans}
    assert flagged and listed, "Lens listed no trace of the workload for eacgm.anomaly=true"
    assert listed <= flagged, f"Lens listed unflagged traces: {sorted(listed - flagged)}"


def test_lens_shows_a_flagged_traces_tree(e2e_run: Run) -> None:
    trace_id = next(t for t in lens_flagged_traces(e2e_run) if any(s["trace_id"] == t for s in e2e_run.spans()))
    spans = [s for s in e2e_run.spans() if s["trace_id"] == trace_id]
    (root,) = [s for s in spans if not s["parent_span_id"]]
    children = sorted((s for s in spans if s["parent_span_id"] == root["span_id"]), key=lambda s: s["start"])
    assert len(children) == len(spans) - 1, "the step's calls hang off its Python span"
    assert root["attributes"]["eacgm.layer"] == "python"
    assert {c["attributes"]["eacgm.layer"] for c in children} <= {"cuda.runtime", "nccl"}
    url = trace_url(e2e_run.zipkin_ui, trace_id)
    rows = tree_rows(dump_dom(url), SERVICE)
    # The root row: the Python step, its toggle showing the number of its children; below it,
    # leaves, the calls in start order (Lens renders the rows that fit the window).
    assert rows[0] == (root["name"].lower(), len(children)), rows[:3]
    assert len(rows) > 5, rows
    assert rows[1:] == [(c["name"].lower(), None) for c in children[:len(rows) - 1]]
    png = e2e_run.log_dir / DOCS_SHOT.name
    checked_screenshot(url, png, SCREEN, DOCS_SHOT)
