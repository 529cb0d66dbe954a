"""VictoriaLogs' LogsQL query API and its web UI's URLs, as the tests use them."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from datetime import datetime, timezone


def query(base: str, logsql: str, start_ns: int, end_ns: int, limit: int = 1000) -> list[dict]:
    """POST /select/logsql/query: the records matching logsql with _time in [start, end] (the
    API's end is exclusive)."""
    body = urllib.parse.urlencode({"query": logsql, "start": _rfc3339(start_ns), "end": _rfc3339(end_ns + 1),
                                   "limit": limit}).encode()
    with urllib.request.urlopen(f"{base}/select/logsql/query", data=body, timeout=10) as resp:
        return [json.loads(line) for line in resp.read().decode().splitlines() if line.strip()]


def _rfc3339(ns: int) -> str:
    """RFC 3339 with nanoseconds, in UTC: VictoriaLogs reads a unix time in whole seconds only
    (the .5 s of a window's end would be cut off)."""
    return datetime.fromtimestamp(ns // 10**9, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{ns % 10**9:09d}Z"


def _utc(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def ui_url(base: str, logsql: str, end_ns: int, range_input: str = "1h") -> str:
    """The web UI (vmui) showing logsql's records in the range_input before end_ns (in UTC, the
    browser's zone here)."""
    fragment = urllib.parse.urlencode({"query": logsql, "g0.range_input": range_input,
                                       "g0.end_input": _utc(end_ns), "g0.relative_time": "none"})
    return f"{base}/select/vmui/#/?{fragment}"
