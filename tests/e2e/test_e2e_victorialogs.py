"""The detector's anomaly records in a real log store: VictoriaLogs v1.52.2 (built from the Go
module proxy by scripts/build-victorialogs.sh), fed by the pipeline Collector's otlphttp
exporter. Its LogsQL API finds the injected fault's eacgm.anomaly records by entity and time,
the same the tests' store received; its web UI, in headless Chromium, lists them.

The screenshot goes to the run's folder, and to docs/screenshots/ when EACGM_DOCS_SCREENSHOTS=1.
"""

from __future__ import annotations

import html
import time

import pytest

from collector_build import REPO
from e2e_stack import Run
from headless_chromium import checked_screenshot, dump_dom
from victorialogs_api import query, ui_url

pytestmark = pytest.mark.ebpf
SCREEN = (1400, 900)
DOCS_SHOT = REPO / "docs/screenshots/victorialogs-anomalies.png"


def entity_query(run: Run) -> str:
    """LogsQL: the detector's anomaly events about the workload process."""
    return f'event_name:"eacgm.anomaly" AND process.pid:"{run.pid}"'


def stored_records(run: Run, start_ns: int, end_ns: int, expect: int) -> list[dict]:
    """The entity's records in [start, end], once VictoriaLogs has the expected number (it makes
    new records searchable within a second or so)."""
    deadline = time.monotonic() + 30
    while True:
        records = query(run.victorialogs, entity_query(run), start_ns, end_ns)
        if len(records) >= expect or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def test_anomaly_records_found_by_entity_and_time(e2e_run: Run) -> None:
    events = e2e_run.anomaly_events()
    assert events, "the detector flagged nothing"
    ends = sorted(e["attributes"]["eacgm.anomaly.window.end"] for e in events)
    records = stored_records(e2e_run, ends[0], ends[-1], len(events))
    want = {(e["attributes"]["eacgm.anomaly.window.start"], e["attributes"]["eacgm.anomaly.score"]) for e in events}
    got = {(int(r["eacgm.anomaly.window.start"]), float(r["eacgm.anomaly.score"])) for r in records}
    assert got == want
    assert all(r["host.name"] == events[0]["attributes"]["host.name"] for r in records)
    # The time range filters: before the first flagged window's end there is none of them.
    assert query(e2e_run.victorialogs, entity_query(e2e_run), ends[0] - 3600 * 10**9, ends[0] - 1) == []
    # ... and another entity (a pid that is not the workload's) has none.
    other = f'event_name:"eacgm.anomaly" AND process.pid:"{e2e_run.pid + 1_000_000}"'
    assert query(e2e_run.victorialogs, other, ends[0], ends[-1]) == []


def test_victorialogs_ui_lists_the_records(e2e_run: Run) -> None:
    events = e2e_run.anomaly_events()
    end = max(e["attributes"]["eacgm.anomaly.window.end"] for e in events)
    stored_records(e2e_run, end - 3600 * 10**9, end, len(events))
    url = ui_url(e2e_run.victorialogs, entity_query(e2e_run), end + 60 * 10**9)
    dom = html.unescape(dump_dom(url))
    shown = [e for e in events if e["body"] in dom]
    assert shown == events, f"{len(events) - len(shown)} of {len(events)} anomaly messages not in {url}"
    png = e2e_run.log_dir / DOCS_SHOT.name
    checked_screenshot(url, png, SCREEN, DOCS_SHOT)
