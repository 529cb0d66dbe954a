"""The fault benchmark's analysis: fit on clean runs, score every run, report.

Recording (``fault_detection.py``) and analysis are apart so that runs recorded by several
device commands, each at most 10 minutes, are analysed together. By default the model is
fitted on the first folder's ``clean-train``, and every other clean run of every folder (the
other folders' ``clean-train`` too: each is a fresh process the model never saw) counts as
held-out clean time for the false-alarm rate; ``--fit-on clean-runs`` fits on all clean runs
and scores each clean run with the model of the others (see ``analyse``). Scoring goes
through the detector's own replay (the windowing, features, scoring and attribution of
``detector serve``), and the example anomaly through its own emitter, so the report shows
what a user of the detector would get.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import re
import sys
from pathlib import Path

from agent_session import markdown_table

REPO = Path(__file__).resolve().parent.parent
KINDS = ("spans", "metrics")  # the two detector entities of a run: the traced process, the agent
LAYERS = ("cuda.runtime", "cuda.driver", "nccl", "torch", "python")
# Where each fault should show: the layers (or metric families) a right attribution names.
EXPECTED = {
    "gpu-contention": {"cuda.driver", "cuda.runtime", "torch", "gpu", "calls"},
    "input-stall": {"cuda.driver", "cuda.runtime", "torch", "gpu", "calls"},
    "comm-slowdown": {"nccl"},
    "memory-pressure": {"memory"},
    "straggler": {"cuda.driver", "cuda.runtime", "torch", "gpu", "calls"},
}  # "calls": the call statistics metrics (eacgm.call*), which aggregate every layer
#: Issue 7's targets: a fault caught within this many windows, with the right layer on top, and
#: no false alarm over at least this much clean time.
TARGET_WINDOWS = 2
TARGET_CLEAN_S = 600
#: Recording settings that merged folders must share: a model fitted on one workload or
#: window length says nothing about another.
SAME_RECORDING = ("device", "train_args", "window_s", "metrics_interval_s", "agent_env")


def detector_modules():
    """eacgm_detector as installed, else from detector/ (a PYTHONPATH-only checkout)."""
    try:
        import eacgm_detector  # noqa: F401, PLC0415
    except ImportError:
        sys.path.insert(0, str(REPO / "detector"))
    from eacgm_detector.config import DetectorConfig  # noqa: PLC0415
    from eacgm_detector.online import fit_rows  # noqa: PLC0415
    from eacgm_detector.persist import save_model  # noqa: PLC0415
    from eacgm_detector.records import entity_label  # noqa: PLC0415
    from eacgm_detector.replay import score_otlp, windows_from_otlp  # noqa: PLC0415
    return DetectorConfig, fit_rows, save_model, entity_label, score_otlp, windows_from_otlp


def feature_layer(name: str) -> str:
    """The layer or metric family a detector feature belongs to (span.<layer>.<fn>..., metric.<name>...)."""
    if name.startswith("span."):
        rest = name[len("span."):]
        layer = next((lay for lay in LAYERS if rest.startswith(lay + ".")), rest.split(".", 1)[0])
        fn = rest[len(layer) + 1:]
        return "memory" if re.search(r"Mem(Alloc|Free)|[Mm]alloc|[Ff]ree\b|empty_cache", fn) else layer
    if name.startswith("metric."):
        metric = name[len("metric."):]
        if "memory" in metric:
            return "memory"
        if metric.startswith("hw."):
            return "gpu"
        if metric.startswith("nccl."):
            return "nccl"
        if metric.startswith("system.network") or "retrans" in metric:
            return "network"
        if metric.startswith("eacgm.call"):
            return "calls"
        if metric.startswith("eacgm.agent"):
            return "agent"
        return metric.split(".", 1)[0]
    return "other"


def load_recordings(first: Path, merge: list[Path]) -> tuple[dict, list[dict]]:
    """The first folder's ``runs.json`` and the runs of every folder, each with ``dir`` (its
    recordings) and ``role``: ``train`` (the first folder's clean-train), ``clean`` or
    ``fault``. Runs of merged folders are named ``<folder>/<run>``."""
    meta = json.loads((first / "runs.json").read_text())
    runs, labels = [], set()
    for i, folder in enumerate([first, *merge]):
        m = meta if i == 0 else json.loads((folder / "runs.json").read_text())
        for key in SAME_RECORDING:
            if m["args"].get(key) != meta["args"].get(key):
                raise SystemExit(f"--merge {folder}: recorded with {key}={m['args'].get(key)!r}, but {first} "
                                 f"with {meta['args'].get(key)!r}; merge only runs of one workload and window")
        label = folder.resolve().name
        while i and label in labels:
            label += "+"
        labels.add(label)
        for r in m["runs"]:
            role = "fault" if r["fault"] else ("train" if i == 0 and r["name"] == "clean-train" else "clean")
            runs.append(dict(r, name=r["name"] if i == 0 else f"{label}/{r['name']}", file=r["name"],
                             dir=str(folder / "runs"), role=role))
    if not runs or runs[0]["role"] != "train":
        raise SystemExit(f"{first}/runs.json: no clean-train run first; the model is fitted on it")
    return meta, runs


def analyse(args: argparse.Namespace, meta: dict, runs: list[dict]) -> tuple[str, dict]:
    """Fit one model per entity kind on the training runs, score every run; the report.

    ``args.fit_on``: ``clean-train`` fits on the first folder's clean-train and scores every other
    run with that model; ``clean-runs`` fits on every clean run of every folder, and scores each
    clean run with a model fitted on all the others (leave one run out), the fault runs with the
    model of all of them. A user trains on clean runs of the workload, several processes rather
    than one, and each run's process-to-process differences (GPU temperature, the phase of the
    step against the metric export) are then part of what the model has seen as normal."""
    DetectorConfig, fit_rows, save_model, entity_label, score_otlp, windows_from_otlp = detector_modules()
    w_ns = int(args.window_s * 1e9)
    cfg = DetectorConfig()
    cfg.window_s = args.window_s
    if args.covariance_type:
        cfg.covariance_type = args.covariance_type
    if args.threshold_risk:
        cfg.threshold_risk = args.threshold_risk
    cfg.validate()
    leave_one_out = args.fit_on == "clean-runs"
    if leave_one_out:
        runs = [dict(r, role="clean") if r["role"] == "train" else r for r in runs]
    training = [r for r in runs if r["role"] == "clean"] if leave_one_out else runs[:1]
    windows = {(r["name"], kind): windows_from_otlp(Path(r["dir"]) / f"{r['file']}.{kind}.jsonl", cfg)
               for r in training for kind in KINDS}

    def fit(kind: str, without: str | None = None):
        rows = [w for r in training if r["name"] != without for w in windows[(r["name"], kind)]]
        return fit_rows(cfg, rows) if len(rows) >= 10 else None

    models, fits = {}, {}
    for kind in KINDS:
        model = fit(kind)
        if model is None:
            print(f"no {kind} model: the training runs have fewer than 10 {kind} windows", file=sys.stderr)
            continue
        models[kind] = model
        save_model(args.out / f"model-{kind}.npz", model)
        det = model.detector
        fits[kind] = {"windows": sum(len(windows[(r["name"], kind)]) for r in training),
                      "features": len(model.feature_names), "components": int(det.n_components_),
                      "threshold": round(float(det.threshold_), 3), "threshold_method": det.threshold_method_}
        print(f"{kind} model: {fits[kind]}", flush=True)
    (args.out / "scores").mkdir(exist_ok=True)
    results, example = [], None
    for r in runs if leave_one_out else runs[1:]:
        own = {kind: fit(kind, without=r["name"]) for kind in models} if leave_one_out and r["role"] == "clean" else models
        scored = []
        for kind, model in own.items():
            if model is not None:
                scored += [(kind, x) for x in score_otlp(Path(r["dir"]) / f"{r['file']}.{kind}.jsonl", cfg, model)]
        scored.sort(key=lambda kx: kx[1].start_ns)
        # A lead-in window before the measured span (fault_detection.write_run) is scored, as
        # a live detector sees it, but not counted.
        measured = [(k, x) for k, x in scored if x.start_ns >= r["lo_ns"]]
        # Each window with both fitted thresholds, the threshold it was compared with (moved
        # by drift) and its run below that, so that another decision rule can be tried on these
        # files alone once the recordings are gone (fault_rule_replay.py).
        with open(args.out / "scores" / f"{r['name'].replace('/', '__')}.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["timestamp", "window_end", "model", "entity", "score", "threshold", "single_threshold",
                        "below", "anomaly", "rule", "top_features", "measured", "compared_with"])
            for kind, x in scored:
                det = own[kind].detector
                w.writerow([x.start_ns, x.end_ns, kind, entity_label(x.entity), x.score, det.threshold_,
                            det.single_threshold_, x.below, int(x.anomalous), x.rule or "",
                            ";".join(c.name for c in x.top), int(x.start_ns >= r["lo_ns"]), x.threshold])
        flagged = [(k, x) for k, x in measured if x.anomalous]
        if r["role"] == "fault" and flagged:
            example = _better_example(example, r["name"], flagged)
        first_kind, first = flagged[0] if flagged else (None, None)
        top = [(c.name, c.category, feature_layer(c.name)) for c in first.top] if first else []
        expected = EXPECTED.get(r["fault"] or "", set())
        per_kind = {k: {"scored": sum(1 for kk, _ in measured if kk == k), "anomalous": sum(1 for kk, _ in flagged if kk == k)}
                    for k in models}
        results.append(dict(r, scored_windows=len(measured), flagged_windows=len(flagged), per_model=per_kind,
                            flagged_windows_any=len({x.start_ns for _, x in flagged}),
                            detected=bool(flagged), windows_to_first=(first.start_ns - r["lo_ns"]) // w_ns + 1 if first else None,
                            first_model=first_kind, first_entity=entity_label(first.entity) if first else None,
                            first_score=first.score if first else None, top_features=top,
                            layer_right=any(t[2] in expected for t in top) if first and expected else None))
    (args.out / "example_anomaly.json").unlink(missing_ok=True)  # an earlier analysis's
    shown = write_example(args.out / "example_anomaly.json", example) if example else None
    return report(args, meta, training, fits, list(models), results, shown)


def _better_example(best: tuple | None, run: str, flagged: list) -> tuple:
    """The anomaly to show: the first one of the first fault run that has one, preferring a
    window of the spans model (its event links to spans, and its spans come back annotated)."""
    with_spans = [(k, x) for k, x in flagged if x.span_refs]
    candidate = (run, *(with_spans or flagged)[0])
    if best is None or (with_spans and not best[2].span_refs):
        return candidate
    return best


def write_example(path: Path, example: tuple) -> dict:
    """The anomaly's OTLP log record and one of its annotated spans, exactly as the detector's
    emitter builds them (``emit.logs_request`` / ``emit.spans_request``), as OTLP/JSON; the
    span is the first one the event names (the slowest of the top span feature's function).
    Written to ``path`` and returned."""
    from eacgm_detector.emit import logs_request, spans_request  # noqa: PLC0415 - see detector_modules()
    from eacgm_detector.records import entity_label  # noqa: PLC0415
    from eacgm_detector.replay import otlp_json_line  # noqa: PLC0415

    run, kind, res = example
    shown = {"run": run, "model": kind, "entity": entity_label(res.entity), "window_start_ns": res.start_ns,
             "window_end_ns": res.end_ns, "spans_in_window": len(res.span_refs),
             "log": json.loads(otlp_json_line(logs_request([res])))}
    traces = spans_request([res])
    if traces is not None:
        keep = res.affected[0][1] if res.affected else None
        one = _one_span(traces, keep) or _one_span(traces, None)
        shown["span"] = json.loads(otlp_json_line(one))
    path.write_text(json.dumps(shown, indent=1))
    return shown


def _one_span(traces, span_id: bytes | None):
    """``traces`` cut to its span ``span_id`` (None: its first span), with that span's resource
    and scope as sent; None when it has no such span."""
    for rs in traces.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                if span_id is None or span.span_id == span_id:
                    out = type(traces)()
                    nrs = out.resource_spans.add(schema_url=rs.schema_url)
                    nrs.resource.CopyFrom(rs.resource)
                    nss = nrs.scope_spans.add(schema_url=ss.schema_url)
                    nss.scope.CopyFrom(ss.scope)
                    nss.spans.add().CopyFrom(span)
                    return out
    return None


def report(args, meta: dict, training: list[dict], fits: dict, models: list[str], results: list[dict],
           shown: dict | None) -> tuple[str, dict]:
    """The .md report (also returned as text) and the JSON result."""
    clean = [x for x in results if x["role"] == "clean"]
    clean_s = sum(x["windows"] * args.window_s for x in clean)
    clean_h = clean_s / 3600
    fa = {k: sum(x["per_model"][k]["anomalous"] for x in clean) for k in models}
    fa_any = sum(x["flagged_windows_any"] for x in clean)
    per_hour = {k: (v / clean_h if clean_h else None) for k, v in fa.items()}
    faults = [x for x in results if x["role"] == "fault"]
    caught = [x for x in faults if x["detected"] and x["windows_to_first"] <= TARGET_WINDOWS and x["layer_right"]]
    table = [[x["name"], x["steps"], x["step_ms_median"], x["step_ms_p95"], x["fault_every"], x["spans"], x["points"],
              " / ".join(f"{x['per_model'][k]['anomalous']} of {x['per_model'][k]['scored']}" for k in models),
              "yes" if x["detected"] else "no", x["windows_to_first"], x["first_model"],
              "; ".join(f"{n} ({c}, {lay})" for n, c, lay in x["top_features"]) or None,
              ",".join(sorted(EXPECTED.get(x["fault"] or "", []))) or None, x["layer_right"]] for x in results]
    header = ["run", "steps", "step ms median", "step ms p95", "fault every N steps", "spans", "metric points",
              "anomalous windows (" + " / ".join(models) + ")", "detected", "windows to first anomaly", "model",
              "top features of the first anomaly (category, layer)", "expected layer", "layer right"]
    recorded = meta["args"]
    lines = [
        f"# fault detection: device {recorded['device']}, examples/train.py {recorded['train_args']}, "
        f"window {args.window_s} s, host {platform.node()} ({os.cpu_count()} CPUs)",
        f"fitted on {len(training)} clean run(s) ({', '.join(r['name'] for r in training)}"
        + ("; each clean run scored by the model of the others" if len(training) > 1 else "")
        + f"): {sum(r['steps'] for r in training)} steps (median of run medians "
        f"{sorted(r['step_ms_median'] for r in training)[len(training) // 2]:.2f} ms), "
        f"{sum(r['spans'] for r in training)} spans, {sum(r['points'] for r in training)} metric points; "
        f"models (fitted on all of them): {fits}", "",
        markdown_table(header, table), "",
        f"false alarms over {len(clean)} clean held-out runs, {clean_s / 60:.1f} min ({round(clean_s / args.window_s)} "
        f"windows): " + ", ".join(f"{k} model {fa[k]} windows = {per_hour[k]:.1f}/h" for k in models)
        + f"; either model {fa_any} windows = {fa_any / clean_h if clean_h else math.nan:.1f}/h",
        f"targets (issue 7): faults caught within {TARGET_WINDOWS} windows with the right layer on top: "
        f"{len(caught)} of {len(faults)}; no false alarm over >= {TARGET_CLEAN_S / 60:.0f} min of clean runs: "
        + ("met" if fa_any == 0 and clean_s >= TARGET_CLEAN_S else
           f"not met ({fa_any} false alarms" + (f", only {clean_s / 60:.1f} min" if clean_s < TARGET_CLEAN_S else "") + ")"),
        "windows to first anomaly: 1 = the run's first measured window (faults strike from the start)",
        f"agent: {meta['agent']['done']}; stop {meta['agent']['stop_s']} s", ""]
    if shown:
        lines += example_section(shown)
    text = "\n".join(lines)
    (args.out / "fault_detection.md").write_text(text)
    return text, {"fits": fits, "results": results, "false_alarms": fa, "false_alarms_per_hour": per_hour,
                  "false_alarm_windows_any": fa_any, "clean_s": clean_s, "clean_runs": len(clean),
                  "faults_caught_on_target": len(caught), "example_anomaly": shown,
                  **{k: meta[k] for k in ("agent", "agent_ready_s")}, "args": meta["args"]}


def example_section(shown: dict) -> list[str]:
    """The example anomaly as the report shows it: the event's message, then both messages."""
    log = shown["log"]["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]
    out = ["## One anomaly as a user sees it", "",
           f"The first anomaly of `{shown['run']}` ({shown['model']} model, entity `{shown['entity']}`), as the "
           "detector's emitter (`detector/eacgm_detector/emit.py`) sends it; also in `example_anomaly.json`. The event's message:", "",
           f"> {log['body']['stringValue']}", "",
           "The `eacgm.anomaly` log record (OTLP/JSON, `ExportLogsServiceRequest`):", "",
           "```json", compact_json(shown["log"]), "```", ""]
    if "span" in shown:
        out += [f"One of the window's {shown['spans_in_window']} spans as the detector re-exports it, annotated with "
                "`eacgm.anomaly` and `eacgm.anomaly.score` (the span the event names first; "
                "`ExportTraceServiceRequest`):", "",
                "```json", compact_json(shown["span"]), "```", ""]
    else:
        out += ["The window came from the agent's metrics, so no span is re-exported with it.", ""]
    return out


def compact_json(obj, indent: str = "", width: int = 100) -> str:
    """JSON with one line for whatever fits in ``width`` (an attribute, a scope), else one line
    per member: OTLP/JSON at one member per line is hundreds of lines for one span."""
    flat = json.dumps(obj)
    if len(indent) + len(flat) <= width or not isinstance(obj, (dict, list)) or not obj:
        return flat
    inner = indent + " "
    if isinstance(obj, dict):
        items = [f"{inner}{json.dumps(k)}: {compact_json(v, inner, width).lstrip()}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    items = [inner + compact_json(v, inner, width).lstrip() for v in obj]
    return "[\n" + ",\n".join(items) + f"\n{indent}]"
