"""Jaeger's HTTP query API (the one its UI uses), as the tests read it."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def find_traces(ui: str, service: str, *, tags: dict[str, str], start_ns: int, end_ns: int,
                limit: int = 10000) -> list[dict]:
    """GET /api/traces: the traces of `service` in [start, end] with a span carrying every tag."""
    query = urllib.parse.urlencode({"service": service, "tags": json.dumps(tags), "limit": limit,
                                    "start": start_ns // 1000, "end": end_ns // 1000 + 1})
    return _get(f"{ui}/api/traces?{query}")["data"]


def get_trace(ui: str, trace_id: str) -> dict:
    """GET /api/traces/{id}: the one trace with that (hex) id."""
    data = _get(f"{ui}/api/traces/{trace_id}")["data"]
    if len(data) != 1:
        raise AssertionError(f"Jaeger returned {len(data)} traces for id {trace_id}")
    return data[0]


def tags_of(span: dict) -> dict[str, object]:
    """A Jaeger span's tags as a dict."""
    return {t["key"]: t["value"] for t in span["tags"]}
