"""Offline inputs: recorded OTLP as JSON lines, and feature tables as CSV.

A recorded OTLP file has one export request per line in OTLP/JSON (what the collector's
file exporter writes): ``{"resourceSpans": ...}``, ``{"resourceMetrics": ...}`` or
``{"resourceLogs": ...}``. Ids are hex there, as the OTLP/JSON spec says, while protobuf's
JSON parser wants base64, hence the conversion.
"""

from __future__ import annotations

import base64
import csv
import json
import math
from pathlib import Path
from typing import Iterator

import numpy as np
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from eacgm_detector.config import DetectorConfig
from eacgm_detector.context import ContextTracker
from eacgm_detector.features import window_features
from eacgm_detector.online import WindowResult
from eacgm_detector.persist import SavedModel
from eacgm_detector.pipeline import Detector

_KINDS = {"resourceSpans": ExportTraceServiceRequest, "resourceMetrics": ExportMetricsServiceRequest,
          "resourceLogs": ExportLogsServiceRequest}
_ID_KEYS = {"traceId": 32, "spanId": 16, "parentSpanId": 16}
TIMESTAMP = "timestamp"


def _hex_ids_to_base64(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k in _ID_KEYS and isinstance(v, str) and len(v) == _ID_KEYS[k]:
                node[k] = base64.b64encode(bytes.fromhex(v)).decode()
            else:
                _hex_ids_to_base64(v)
    elif isinstance(node, list):
        for x in node:
            _hex_ids_to_base64(x)
    return node


def _base64_ids_to_hex(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k in _ID_KEYS and isinstance(v, str):
                node[k] = base64.b64decode(v).hex()
            else:
                _base64_ids_to_hex(v)
    elif isinstance(node, list):
        for x in node:
            _base64_ids_to_hex(x)
    return node


def otlp_json_line(req) -> str:
    """One export request as a line of a recorded OTLP/JSON file (ids in hex), what
    read_otlp_jsonl reads back."""
    return json.dumps(_base64_ids_to_hex(json_format.MessageToDict(req))) + "\n"


def read_otlp_jsonl(path: str | Path) -> Iterator:
    """Yield the export requests of a recorded OTLP/JSON-lines file."""
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                kind = next(k for k in _KINDS if k in data)
                yield json_format.ParseDict(_hex_ids_to_base64(data), _KINDS[kind]())
            except (json.JSONDecodeError, StopIteration, json_format.ParseError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: not an OTLP/JSON export request ({exc})") from exc


def _replay(path: str | Path, det: Detector, collect) -> list:
    """Feed a recording to ``det`` request by request; ``collect(final)`` gathers what the
    watermark released after each request (``final=False``) and the rest at the end."""
    add = {ExportTraceServiceRequest: det.add_traces, ExportMetricsServiceRequest: det.add_metrics,
           ExportLogsServiceRequest: det.add_logs}
    out = []
    for req in read_otlp_jsonl(path):
        add[type(req)](req)
        out.extend(collect(False))
    out.extend(collect(True))
    return out


def windows_from_otlp(path: str | Path, cfg: DetectorConfig) -> list[dict[str, float]]:
    """Feature dicts of every window in a recording, all entities pooled, in time order;
    each window's context features come from its own entity's previous windows."""
    det = Detector(cfg)

    def closed(final: bool) -> list:
        return [w for ent in det.entities.values()
                for w in (ent.windows.drain() if final else ent.windows.ready())]
    wins = _replay(path, det, closed)
    wins.sort(key=lambda w: (w.start_ns, w.entity))
    trackers: dict = {}
    return [trackers.setdefault(w.entity, ContextTracker(cfg.context_windows)).augment(window_features(w))
            for w in wins]


def score_otlp(path: str | Path, cfg: DetectorConfig, model: SavedModel) -> list[WindowResult]:
    """Every window of a recording scored by a fixed ``model``, in time order."""
    det = Detector(cfg, model)
    results = _replay(path, det, lambda final: det.drain() if final else det.ready())
    return sorted(results, key=lambda r: (r.start_ns, r.entity))


def read_csv(path: str | Path) -> tuple[list[str], np.ndarray, list[str] | None]:
    """Feature names, values (NaN for empty cells) and the optional ``timestamp`` column."""
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise ValueError(f"{path}: empty CSV, expected a header row of feature names") from None
        ts_col = header.index(TIMESTAMP) if TIMESTAMP in header else None
        names = [h for i, h in enumerate(header) if i != ts_col]
        rows, stamps = [], []
        for lineno, row in enumerate(reader, 2):
            if len(row) != len(header):
                raise ValueError(f"{path}:{lineno}: {len(row)} cells, header has {len(header)}")
            if ts_col is not None:
                stamps.append(row[ts_col])
            try:
                rows.append([float(c) if c.strip() else math.nan
                             for i, c in enumerate(row) if i != ts_col])
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: {exc}; expected numbers or empty cells") from exc
    return names, np.array(rows, dtype=float).reshape(len(rows), len(names)), (stamps if ts_col is not None else None)
