"""Zipkin Lens (Zipkin's web UI) as headless Chromium renders it: the URLs the tests open and
what they read back from the rendered DOM."""

from __future__ import annotations

import re
import urllib.parse

#: One row of Lens's trace tree: an absolutely placed 30 px line of its virtualized list.
_ROW = re.compile(r'<div style="position: absolute; left: 0px; top: \d+px; height: 30px; width: 100%;">')
#: A row whose span has children shows a toggle button labelled with their number.
_CHILDREN = re.compile(r'<span class="MuiButton-label">(\d+)<svg')


def search_url(base: str, service: str, tag_query: str, end_ns: int) -> str:
    """Lens's search page for service's traces with a span tag matching tag_query ("k=v") in the
    hour before end_ns; Lens runs the search when the URL carries its criteria."""
    query = urllib.parse.urlencode({"serviceName": service, "annotationQuery": tag_query, "lookback": "1h",
                                    "endTs": end_ns // 10**6, "limit": 100})
    return f"{base}/zipkin/?{query}"


def trace_url(base: str, trace_id: str) -> str:
    """Lens's page of one trace: its span tree and timeline."""
    return f"{base}/zipkin/traces/{trace_id}"


def listed_traces(dom: str) -> list[str]:
    """Trace ids (32 hex digits) a rendered search page lists, in its order."""
    return list(dict.fromkeys(re.findall(r"\b[0-9a-f]{32}\b", dom)))


def tree_rows(dom: str, service: str) -> list[tuple[str, int | None]]:
    """The rows of a rendered trace page, top to bottom: (span name as Lens shows it, the number
    of children its toggle shows, or None for a leaf)."""
    rows = []
    for block in _ROW.split(dom)[1:]:
        name = re.search(rf">{re.escape(service)}: ([^<]+)</div>", block)
        if name:
            children = _CHILDREN.search(block)
            rows.append((name[1], int(children[1]) if children else None))
    return rows

