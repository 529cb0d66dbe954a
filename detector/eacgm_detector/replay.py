"""Offline inputs: recorded OTLP as JSON lines, and feature tables as CSV.

A recorded OTLP file has one export request per line in OTLP/JSON (what the collector's
file exporter writes): ``{"resourceSpans": ...}``, ``{"resourceMetrics": ...}`` or
``{"resourceLogs": ...}``. Ids are hex there, as the OTLP/JSON spec says, while protobuf's
JSON parser wants base64, hence the conversion.

Both are untrusted input read for ``fit`` and ``score``, and every refusal is a ``ValueError``
that names the file and the line (and the column or window where there is one): a line that
is no UTF-8, no JSON object or no export request; JSON nested deeper than
:data:`MAX_JSON_DEPTH`; a CSV cell that is no number, not finite or beyond
:data:`~eacgm_detector.model.MAX_ABS_VALUE`; a header without feature columns or with a name
twice; and, in a recording, a window feature beyond that magnitude.
"""

from __future__ import annotations

import base64
import csv
import json
import math
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from eacgm_detector.config import DetectorConfig
from eacgm_detector.context import ContextTracker
from eacgm_detector.features import window_features
from eacgm_detector.model import MAX_ABS_VALUE
from eacgm_detector.online import WindowResult
from eacgm_detector.persist import SavedModel
from eacgm_detector.pipeline import Detector
from eacgm_detector.records import entity_label

_KINDS = {"resourceSpans": ExportTraceServiceRequest, "resourceMetrics": ExportMetricsServiceRequest,
          "resourceLogs": ExportLogsServiceRequest}
_ID_KEYS = {"traceId": 32, "spanId": 16, "parentSpanId": 16}
TIMESTAMP = "timestamp"
#: Deepest nesting of JSON arrays and objects on one line of a recording (the line's own object
#: is level 1). Beyond any export request that protobuf's JSON parser accepts (it stops at 100
#: nested messages; nested ``AnyValue`` arrays, the deepest shape, take 1.5 JSON levels per
#: message), and far below Python's recursion limit, which the recursive parts of parsing
#: (``json.loads``, ``ParseDict``) would otherwise run into with a ``RecursionError``.
MAX_JSON_DEPTH = 256


def _too_deep() -> ValueError:
    return ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep")


def _hex_ids_to_base64(root):
    """Hex ids to base64, in place, walking the document without recursion; ValueError when it
    is nested deeper than :data:`MAX_JSON_DEPTH`."""
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        for k, v in (node.items() if isinstance(node, dict) else enumerate(node)):
            if isinstance(v, (dict, list)):
                stack.append((v, depth + 1))
            elif isinstance(node, dict) and k in _ID_KEYS and isinstance(v, str) and len(v) == _ID_KEYS[k]:
                node[k] = base64.b64encode(bytes.fromhex(v)).decode()
    return root


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
    """Yield the export requests of a recorded OTLP/JSON-lines file; ``ValueError`` naming the
    file and line for one that is not (see the module's docstring)."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                req = _request(raw)
            except (ValueError, json_format.ParseError) as exc:  # UnicodeDecodeError, JSONDecodeError too
                raise ValueError(f"{path}:{lineno}: not an OTLP/JSON export request ({_one_line(exc)})") from exc
            if req is not None:
                yield req


def _request(raw: bytes):
    """The export request of one line, None for a blank line."""
    line = raw.decode("utf-8")
    if not line.strip():
        return None
    try:
        data = json.loads(line)
    except RecursionError:  # Python's parser gives up before it returns anything deeper
        raise _too_deep() from None
    kind = next((k for k in _KINDS if k in data), None) if isinstance(data, dict) else None
    if kind is None:
        raise ValueError(f"expected a JSON object with one of the keys {', '.join(_KINDS)}")
    return json_format.ParseDict(_hex_ids_to_base64(data), _KINDS[kind]())


def _one_line(exc: Exception) -> str:
    """An exception's message on one line (protobuf's span several)."""
    return " ".join(str(exc).split())


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
    rows = [trackers.setdefault(w.entity, ContextTracker(cfg.context_windows)).augment(window_features(w))
            for w in wins]
    for w, feats in zip(wins, rows):
        for name, value in feats.items():
            if not abs(value) <= MAX_ABS_VALUE and not math.isnan(value):
                raise ValueError(
                    f"{path}: window [{w.start_ns}, {w.end_ns}) ns of {entity_label(w.entity)}: feature "
                    f"{name} = {value:g} is {_beyond(value)}; expected features within +-{MAX_ABS_VALUE:g}"
                )
    return rows


def _beyond(value: float) -> str:
    """Why a value is refused: its float64 statistics would overflow (see MAX_ABS_VALUE)."""
    if not math.isfinite(value):
        return "not finite"
    return f"beyond +-{MAX_ABS_VALUE:g} (float64 statistics of such values overflow)"


def score_otlp(path: str | Path, cfg: DetectorConfig, model: SavedModel) -> list[WindowResult]:
    """Every window of a recording scored by a fixed ``model``, in time order."""
    det = Detector(cfg, model)
    results = _replay(path, det, lambda final: det.drain() if final else det.ready())
    return sorted(results, key=lambda r: (r.start_ns, r.entity))


def read_csv(path: str | Path) -> tuple[list[str], np.ndarray, list[str] | None]:
    """Feature names, values (NaN for empty cells) and the optional ``timestamp`` column.

    ``ValueError`` naming the file and line (and column) for anything else: no header, no
    feature column, a column name twice, a row of another width, a cell that is no number,
    not finite or beyond :data:`~eacgm_detector.model.MAX_ABS_VALUE`.
    """
    with open(path, "rb") as fh:
        reader = csv.reader(_text_lines(fh, path))
        try:
            return _read_table(reader, path)
        except csv.Error as exc:  # a field beyond csv's size limit, a stray quote
            raise ValueError(f"{path}:{reader.line_num}: {exc}") from None


def _text_lines(fh: BinaryIO, path: str | Path) -> Iterator[str]:
    """The lines of a binary file as UTF-8 text (a byte-order mark is skipped), naming the
    line that is not."""
    for lineno, raw in enumerate(fh, 1):
        try:
            yield raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not UTF-8 text ({exc})") from None


def _read_table(reader, path: str | Path) -> tuple[list[str], np.ndarray, list[str] | None]:
    header = next(reader, None)
    if header is None:
        raise ValueError(f"{path}: empty CSV, expected a header row of feature names")
    seen: set[str] = set()
    for h in header:
        if h in seen:
            raise ValueError(f"{path}:{reader.line_num}: column {h!r} appears twice; expected distinct names")
        seen.add(h)
    ts_col = header.index(TIMESTAMP) if TIMESTAMP in header else None
    names = [h for i, h in enumerate(header) if i != ts_col]
    if not names:
        raise ValueError(f"{path}:{reader.line_num}: no feature columns, only {header!r}; expected a "
                         f"column per feature")
    rows, stamps, lines = [], [], []
    for row in reader:
        lineno = reader.line_num
        if len(row) != len(header):
            raise ValueError(f"{path}:{lineno}: {len(row)} cells, header has {len(header)}")
        if ts_col is not None:
            stamps.append(row[ts_col])
        try:
            rows.append([float(c) if c.strip() else math.nan
                         for i, c in enumerate(row) if i != ts_col])
        except ValueError as exc:
            raise ValueError(f"{path}:{lineno}: {exc}; expected numbers or empty cells") from exc
        lines.append(lineno)
    X = np.array(rows, dtype=float).reshape(len(rows), len(names))
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(X) <= MAX_ABS_VALUE) & ~np.isnan(X)
    if bad.any():
        i, j = (int(k[0]) for k in np.nonzero(bad))
        raise ValueError(f"{path}:{lines[i]}: column {names[j]!r}: {X[i, j]:g} is {_beyond(X[i, j])}; "
                         f"expected numbers within +-{MAX_ABS_VALUE:g} or empty cells")
    return names, X, (stamps if ts_col is not None else None)
