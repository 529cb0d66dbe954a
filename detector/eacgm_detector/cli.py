"""``otel-eacgm detector {serve,fit,score}``.

``serve`` runs the OTLP receiver; ``fit`` trains a model offline from recorded OTLP
(``.jsonl``/``.json``) or a CSV of window features; ``score`` writes, per CSV row (or per
window of a recording), the score, the threshold, the 0/1 anomaly flag that ``serve`` would
raise and the confirmation rule that raised it (``GMMDetector.rule``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import csv
import logging
import os
import signal
import sys
import threading

from eacgm_detector.atomic import atomic_write
from eacgm_detector.config import DetectorConfig
from eacgm_detector.online import fit_rows, fit_table, table_features
from eacgm_detector.persist import SavedModel, load_model, save_model
from eacgm_detector.records import entity_label
from eacgm_detector.replay import read_csv, score_otlp, windows_from_otlp
from otel_eacgm import environment_variables as env_vars
from otel_eacgm.settings import field_docs

log = logging.getLogger("eacgm_detector")


# Settings a subcommand may take as a flag (argparse dest = setting name); absent ones are None.
_FLAG_KEYS = ("listen", "insecure_listen", "export_endpoint", "model_path", "covariance_type", "max_components",
              "window_s", "threshold_method", "threshold_risk", "alarms_per_hour", "confirm_windows",
              "drift_windows")


def _config(args) -> DetectorConfig:
    """Flags > OTEL_EACGM_DETECTOR_<KEY> > --config file > defaults (otel_eacgm.settings)."""
    cfg = DetectorConfig.load(args.config, {key: getattr(args, key, None) for key in _FLAG_KEYS})
    if getattr(args, "command", None) == "serve" and cfg.export_endpoint is None:
        env = os.environ.get(env_vars.OTEL_EXPORTER_OTLP_ENDPOINT)
        if env:
            cfg.export_endpoint = env.removeprefix("http://").removeprefix("https://")
    return cfg.validate()


def _serve(args) -> int:
    import time

    from eacgm_detector.exporter import OtlpExporter
    from eacgm_detector.pipeline import Detector
    from eacgm_detector.service import DetectorService

    cfg = _config(args)
    model = load_model(cfg.model_path) if cfg.model_path else None
    if model is not None:
        cfg = _model_window(cfg, model)
    exporter = (OtlpExporter(cfg.export_endpoint, insecure=cfg.export_insecure, ca_file=cfg.export_ca_file)
                if cfg.export_endpoint else None)
    svc = DetectorService(cfg, Detector(cfg, model, clock=time.monotonic), exporter).start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # Woken every 0.5 s: a signal the kernel gives one of gRPC's threads wakes no wait here, and
    # Python runs its handler in this thread only when this thread runs again.
    while not stop.wait(0.5):
        pass
    svc.stop()
    return 0


@contextlib.contextmanager
def _naming(path: str):
    """Data errors raised within (scikit-learn's among them) name the input file ``path``."""
    try:
        yield
    except ValueError as exc:
        if str(exc).startswith(path):
            raise
        raise ValueError(f"{path}: {exc}") from exc


def _fit(args) -> int:
    cfg = _config(args)
    if args.input.endswith((".jsonl", ".json")):
        rows = windows_from_otlp(args.input, cfg)
        if len(rows) < 10:
            raise ValueError(f"{args.input}: {len(rows)} windows, need >= 10 to fit")
        with _naming(args.input):
            model = fit_rows(cfg, rows, source=args.input)
    else:
        names, X, _ = read_csv(args.input)
        if len(X) < 2:
            count = "no data rows" if len(X) == 0 else "1 data row"
            raise ValueError(f"{args.input}: {count}, need at least 2 windows to fit")
        with _naming(args.input):
            model = fit_table(cfg, names, X, source=args.input)
    save_model(args.output, model)
    det = model.detector
    print(f"fitted {det.n_components_} components ({det.covariance_type}) on {len(model.feature_names)} "
          f"features; threshold {det.threshold_:.3f} ({det.threshold_method_}); saved {args.output}")
    return 0


def _model_window(cfg: DetectorConfig, model: SavedModel) -> DetectorConfig:
    """Use the window length the model was trained on: its counts and rates mean nothing
    over another length."""
    if model.window_s is not None and model.window_s != cfg.window_s:
        log.warning("window_s %.6g replaced by the model's own %.6g", cfg.window_s, model.window_s)
        cfg.window_s = model.window_s
    return cfg.validate()


def _score(args) -> int:
    model = load_model(args.model)
    if args.input.endswith((".jsonl", ".json")):
        return _score_otlp(args, model)
    names, X, stamps = read_csv(args.input)
    Xm, missing = table_features(model, names, X)
    if len(missing) == len(model.base_feature_names):
        raise ValueError(f"{args.input}: none of the model's {len(missing)} features are columns")
    if missing:
        log.warning("%s lacks %d model features (imputed): %s", args.input, len(missing), missing[:5])
    with _naming(args.input):
        scores = model.detector.score_samples(Xm) if len(Xm) else []
    # Rows are consecutive windows of one entity: flagged as `serve` would report them.
    cfg = _config(args)
    confirm = cfg.confirm_windows
    rules, thresholds = model.detector.rules(scores, confirm, cfg.drift_windows)
    with atomic_write(args.output, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow((["timestamp"] if stamps is not None else []) + ["score", "threshold", "anomaly", "rule"])
        for i, (s, rule) in enumerate(zip(scores, rules)):
            w.writerow(([stamps[i]] if stamps is not None else [])
                       + [f"{s:.6g}", f"{thresholds[i]:.6g}", int(rule is not None), rule or ""])
    _report(len(scores), sum(r is not None for r in rules), model, confirm, args.output)
    return 0


def _score_otlp(args, model: SavedModel) -> int:
    """One row per window of a recording: window start (``timestamp``, ns), end, entity,
    score, flag and the top contributing features of flagged windows."""
    cfg = _model_window(_config(args), model)
    with _naming(args.input):
        results = score_otlp(args.input, cfg, model)
    with atomic_write(args.output, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["timestamp", "window_end", "entity", "score", "threshold", "anomaly", "rule",
                    "top_features"])
        for r in results:
            w.writerow([r.start_ns, r.end_ns, entity_label(r.entity), f"{r.score:.6g}", f"{r.threshold:.6g}",
                        int(r.anomalous), r.rule or "", ";".join(c.name for c in r.top)])
    _report(len(results), sum(r.anomalous for r in results), model, cfg.confirm_windows, args.output)
    return 0


def _report(n: int, flagged: int, model: SavedModel, confirm_windows: int, output: str) -> None:
    det = model.detector
    print(f"scored {n} rows, {flagged} anomalous ({confirm_windows} consecutive below threshold "
          f"{det.threshold_:.3f}, or one below {det.single_threshold_:.3f}, both lowered as far as "
          f"the scores drift; each row has its own); wrote {output}")


def _setting(key: str, default: object = dataclasses.MISSING) -> str:
    """A flag's help: the detector setting's docstring and its default (DetectorConfig)."""
    field = {f.name: f for f in dataclasses.fields(DetectorConfig)}[key]
    if default is dataclasses.MISSING:
        default = field.default if field.default_factory is dataclasses.MISSING else field.default_factory()
    doc = " ".join(field_docs(DetectorConfig).get(key, "").split()).replace("%", "%%")
    return f"{doc} (default: {'none' if default is None else default}; setting {key})"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="otel-eacgm detector", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the OTLP gRPC receiver and score windows")
    serve.add_argument("--listen", help=_setting("listen"))
    serve.add_argument("--insecure-listen", dest="insecure_listen", action="store_true", default=None,
                       help=_setting("insecure_listen"))
    serve.add_argument("--export-endpoint", dest="export_endpoint",
                       help=_setting("export_endpoint", "$OTEL_EXPORTER_OTLP_ENDPOINT, else none"))
    serve.add_argument("--model", dest="model_path", help=_setting("model_path", "none: warm up on the first "
                                                                                  "windows, then fit"))
    fit = sub.add_parser("fit", help="train a model offline")
    fit.add_argument("--input", required=True, help="recorded OTLP (.jsonl) or feature CSV (required)")
    fit.add_argument("--output", required=True, help="model file to write (.npz) (required)")
    fit.add_argument("--covariance-type", dest="covariance_type", help=_setting("covariance_type"))
    fit.add_argument("--max-components", dest="max_components", type=int, help=_setting("max_components"))
    fit.add_argument("--window-s", dest="window_s", type=float, help=_setting("window_s"))
    fit.add_argument("--threshold-method", dest="threshold_method", help=_setting("threshold_method"))
    fit.add_argument("--threshold-risk", dest="threshold_risk", type=float, help=_setting("threshold_risk"))
    fit.add_argument("--alarms-per-hour", dest="alarms_per_hour", type=float, help=_setting("alarms_per_hour"))
    score = sub.add_parser("score", help="score a feature CSV or recorded OTLP with a saved model")
    score.add_argument("--model", required=True, help="model file from `fit` (required)")
    score.add_argument("--input", required=True,
                       help="feature CSV (one row per window) or recorded OTLP (.jsonl) (required)")
    score.add_argument("--output", required=True, help="CSV of score and 0/1 anomaly per row (required)")
    for s in (serve, score):
        s.add_argument("--confirm-windows", dest="confirm_windows", type=int, help=_setting("confirm_windows"))
        s.add_argument("--drift-windows", dest="drift_windows", type=int, help=_setting("drift_windows"))
    for s in (serve, fit, score):
        s.add_argument("--config", help="YAML file of detector settings, overridden by OTEL_EACGM_DETECTOR_<KEY> "
                                        "and these flags (default: none)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``otel-eacgm detector`` with ``argv`` (without the program name); return the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return {"serve": _serve, "fit": _fit, "score": _score}[args.command](args)
    except (ValueError, OSError) as exc:
        print(f"otel-eacgm detector {args.command}: {exc}", file=sys.stderr)
        return 2
