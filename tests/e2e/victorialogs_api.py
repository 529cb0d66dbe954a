"""VictoriaLogs' LogsQL query API and its web UI's URLs, as the tests use them."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from datetime import datetime, timezone


def query(base: str, logsql: str, start_ns: int, end_ns: int, limit: int = 1000) -> list[dict]:
    """POST /select/logsql/query: the records matching logsql with _time in [start, end]."""
    body = urllib.parse.urlencode({"query": logsql, "start": f"{start_ns / 1e9:.9f}", "end": f"{end_ns / 1e9:.9f}",
                                   "limit": limit}).encode()
    with urllib.request.urlopen(f"{base}/select/logsql/query", data=body, timeout=10) as resp:
        return [json.loads(line) for line in resp.read().decode().splitlines() if line.strip()]


def _utc(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def ui_url(base: str, logsql: str, end_ns: int, range_input: str = "1h") -> str:
    """The web UI (vmui) showing logsql's records in the range_input before end_ns (in UTC, the
    browser's zone here)."""
    fragment = urllib.parse.urlencode({"query": logsql, "g0.range_input": range_input,
                                       "g0.end_input": _utc(end_ns), "g0.relative_time": "none"})
    return f"{base}/select/vmui/#/?{fragment}"
