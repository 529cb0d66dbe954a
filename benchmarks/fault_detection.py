"""Does the detector find injected faults in a real traced training job, how fast, and naming what?

One agent (default settings, metrics every second so that 2 s windows have points) traces a
small launcher process and therefore every workload it starts (children of a target are
traced); spans and metrics go to the package's OTLP store in this process. The workload is
examples/train.py, unmodified, with the faults of examples/faults/ (another process for GPU
contention, examples/faults/gpu_contention.py, started beside it and not traced). Runs, each a
fresh process:

1. ``clean-train`` (``--train-s``): the detector's training data;
2. ``clean-heldout`` (``--clean-s``): false alarms;
3. one run per fault (``--fault-s`` each): ``gpu-contention``, ``input-stall``,
   ``comm-slowdown``, ``memory-pressure``, ``straggler``. Faults strike every N steps, N chosen so
   that one strike falls about every ``--strike-interval-s`` (from clean-train's median step).

A run's measured span starts at the first window boundary after ``--warmup-steps`` steps and
ends at the last whole window. Each run's telemetry in that span (the workload's spans, and
the agent's metrics that are not about another process) is written as recorded OTLP/JSON lines,
what `otel-eacgm detector fit|score` read: ``OUT/runs/<run>.spans.jsonl`` and
``<run>.metrics.jsonl``. Those are two detector entities (the traced process; the agent, whose
resource carries every metric), so, as `detector serve` gives each entity its own model, one
model per kind is fitted on clean-train (``window_s`` ``--window-s``) and every other run is
scored through the detector's own replay: the same windowing, features, scoring and
attribution as ``detector serve``. Per fault: detected or not, windows from the first measured window to the
first anomalous one, the top features named for it and whether their layer matches the fault;
false alarms per hour on clean-heldout. Results: ``OUT/fault_detection.json``, ``.md``
(printed), per-window scores ``OUT/scores/<run>.csv``, the models ``OUT/model-{spans,metrics}.npz``,
the run timeline ``OUT/runs.json``; ``--analyse-only`` refits and rescores those files anywhere.

    sudo $P benchmarks/fault_detection.py --quick --out results/faults          # H200, ~5 min
    sudo $P benchmarks/fault_detection.py --out results/faults                  # ~9 min
    sudo .venv/bin/python benchmarks/fault_detection.py --quick --out /tmp/fd --device cpu \\
        --train-args "--dim 64 --layers 2 --batch 4 --seq 32"
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import os
import platform
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from agent_session import Agent, markdown_table, wait_gone  # noqa: E402
from otel_eacgm.otlp_store import attrs, serve  # noqa: E402

KINDS = ("spans", "metrics")  # the two detector entities of a run: the traced process, the agent
FAULTS = ("gpu-contention", "input-stall", "comm-slowdown", "memory-pressure", "straggler")
GPU_TRAIN_ARGS = "--dim 1024 --layers 4 --batch 32 --seq 512"
LAYERS = ("cuda.runtime", "cuda.driver", "nccl", "torch", "python")
# Where each fault should show: the layers (or metric families) a right attribution names.
EXPECTED = {
    "gpu-contention": {"cuda.driver", "cuda.runtime", "torch", "gpu", "calls"},
    "input-stall": {"cuda.driver", "cuda.runtime", "torch", "gpu", "calls"},
    "comm-slowdown": {"nccl"},
    "memory-pressure": {"memory"},
    "straggler": {"cuda.driver", "cuda.runtime", "torch", "gpu", "calls"},
}  # "calls": the call statistics metrics (eacgm.call*), which aggregate every layer
STEP_RE = re.compile(r"^step (\d+) loss \S+ ([\d.]+) ms(.*)$")
LAUNCHER = """
import json, os, signal, subprocess, sys
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
for line in sys.stdin:
    req = json.loads(line)
    out = open(req["log"], "wb")
    p = subprocess.Popen(req["argv"], stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, **req["env"]))
    out.close()
    print(p.pid, flush=True)
"""


def detector_modules():
    """eacgm_detector as installed, else loaded from detector/ (a PYTHONPATH-only checkout)."""
    try:
        import eacgm_detector  # noqa: F401, PLC0415
    except ImportError:
        spec = importlib.util.spec_from_file_location("eacgm_detector", REPO / "detector/__init__.py",
                                                      submodule_search_locations=[str(REPO / "detector")])
        module = importlib.util.module_from_spec(spec)
        sys.modules["eacgm_detector"] = module
        spec.loader.exec_module(module)
    from eacgm_detector.config import DetectorConfig  # noqa: PLC0415
    from eacgm_detector.online import fit_rows  # noqa: PLC0415
    from eacgm_detector.persist import save_model  # noqa: PLC0415
    from eacgm_detector.records import entity_label  # noqa: PLC0415
    from eacgm_detector.replay import score_otlp, windows_from_otlp  # noqa: PLC0415
    return DetectorConfig, fit_rows, save_model, entity_label, score_otlp, windows_from_otlp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def write_run(store, stem: Path, pid: int, agent_pid: int, lo: int, hi: int) -> dict:
    """The run's telemetry in [lo, hi) as OTLP/JSON lines: ``stem.spans.jsonl`` (spans of ``pid``)
    and ``stem.metrics.jsonl`` (the agent's metric points that are not about another process).
    They are two detector entities (the traced process; the agent, which reports every metric),
    so each gets its own model, as `detector serve` gives each entity its own. Returns counts."""
    from eacgm_detector.replay import otlp_json_line  # noqa: PLC0415 - loaded by detector_modules()

    n_spans = n_points = 0
    with store._lock:  # noqa: SLF001 - a consistent copy of what arrived so far
        traces, metrics = list(store.traces), list(store.metrics)
    with open(f"{stem}.spans.jsonl", "w") as fh:
        for req in traces:
            out = ExportTraceServiceRequest()
            for rs in req.resource_spans:
                if attrs(rs.resource.attributes).get("process.pid") != pid:
                    continue
                nrs = out.resource_spans.add()
                nrs.resource.CopyFrom(rs.resource)
                for ss in rs.scope_spans:
                    kept = [s for s in ss.spans if lo <= s.start_time_unix_nano < hi]
                    if kept:
                        nss = nrs.scope_spans.add()
                        nss.scope.CopyFrom(ss.scope)
                        nss.spans.extend(kept)
                        n_spans += len(kept)
            if any(rs.scope_spans for rs in out.resource_spans):
                fh.write(otlp_json_line(out))
    with open(f"{stem}.metrics.jsonl", "w") as fh:
        for req in metrics:
            out = ExportMetricsServiceRequest()
            for rm in req.resource_metrics:
                if attrs(rm.resource.attributes).get("process.pid") != agent_pid:
                    continue
                nrm = out.resource_metrics.add()
                nrm.resource.CopyFrom(rm.resource)
                for sm in rm.scope_metrics:
                    nsm = nrm.scope_metrics.add()
                    nsm.scope.CopyFrom(sm.scope)
                    for m in sm.metrics:
                        kind = m.WhichOneof("data")
                        pts = [p for p in getattr(m, kind).data_points if lo <= p.time_unix_nano < hi
                               and attrs(p.attributes).get("process.pid", pid) == pid]
                        if pts:
                            nm = nsm.metrics.add()
                            nm.CopyFrom(m)
                            del getattr(nm, kind).data_points[:]
                            getattr(nm, kind).data_points.extend(pts)
                            n_points += len(pts)
            if any(sm.metrics for rm in out.resource_metrics for sm in rm.scope_metrics):
                fh.write(otlp_json_line(out))
    return {"spans": n_spans, "points": n_points}


class Launcher:
    """A small traced parent: the agent targets its pid, so every workload it starts is traced."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-S", "-c", LAUNCHER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)

    def spawn(self, argv: list[str], log: Path, env: dict[str, str]) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"argv": argv, "log": str(log), "env": env}) + "\n")
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


def steps_of(log: Path) -> list[tuple[int, float, bool]]:
    """(step, ms, faulty) of every step line the workload printed."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = STEP_RE.match(line.strip())
        if m:
            out.append((int(m.group(1)), float(m.group(2)), "fault=" in m.group(3)))
    return out


def kill(pid: int, timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL, a process that is not our child."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        if wait_gone(pid, timeout_s)[1]:
            return


def one_run(name: str, fault: str | None, seconds: float, every: int | None, args, launcher: Launcher) -> dict:
    """Start the workload (and a GPU hog), wait for warm-up, measure whole windows, stop it."""
    log = args.out / "logs" / f"{name}.log"
    argv = [args.python, str(REPO / "examples/train.py"), "--steps", "100000000", "--device", args.device,
            *shlex.split(args.train_args)]
    if fault and fault != "gpu-contention":
        argv += ["--fault", fault, "--fault-every", str(every)]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PYTHONUNBUFFERED": "1"}
    t_spawn = time.monotonic()
    pid = launcher.spawn(argv, log, env)
    while len(steps_of(log)) < args.warmup_steps:
        if not os.path.exists(f"/proc/{pid}") or time.monotonic() - t_spawn > args.start_timeout:
            kill(pid)
            raise RuntimeError(f"{name}: no {args.warmup_steps} steps after {time.monotonic() - t_spawn:.0f} s; "
                               f"see {log}:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)
    warm_steps = len(steps_of(log))
    w_ns = int(args.window_s * 1e9)
    lo = (time.time_ns() // w_ns + 1) * w_ns
    hi = lo + max(1, round(seconds / args.window_s)) * w_ns
    hog = None
    if fault == "gpu-contention":
        hog_argv = [args.python, str(REPO / "examples/faults/gpu_contention.py"), "--device", args.device,
                    "--seconds", str((hi - time.time_ns()) / 1e9 + 2)] + (["--size", "256"] if args.device == "cpu" else [])
        hog = subprocess.Popen(hog_argv, stdout=open(args.out / "logs" / f"{name}-hog.log", "wb"),  # noqa: SIM115
                               stderr=subprocess.STDOUT)
    time.sleep(max(0.0, (hi - time.time_ns()) / 1e9) + 0.2)
    kill(pid)
    if hog:
        hog.terminate()
        hog.wait(15)
    steps = steps_of(log)[warm_steps:]
    ms = [s[1] for s in steps]
    return {"name": name, "fault": fault, "pid": pid, "lo_ns": lo, "hi_ns": hi, "windows": (hi - lo) // w_ns,
            "fault_every": every if fault and fault != "gpu-contention" else None,
            "start_s": round(time.monotonic() - t_spawn - (hi - lo) / 1e9, 1),
            "steps": len(steps), "step_ms_median": statistics.median(ms) if ms else None,
            "step_ms_p95": sorted(ms)[int(0.95 * (len(ms) - 1))] if ms else None,
            "faulty_steps": sum(s[2] for s in steps), "hog_pid": hog.pid if hog else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="60 s training, 30 s clean, 24 s per fault (~5 min; full: 150, 90, 36 s, ~9 min)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if the workload's torch sees a GPU)")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the workload")
    ap.add_argument("--train-args", help=f"model flags for examples/train.py (default on CUDA: {GPU_TRAIN_ARGS!r})")
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--window-s", type=float, default=2.0)
    ap.add_argument("--train-s", type=float, help="clean training run, s (quick 60, full 150)")
    ap.add_argument("--clean-s", type=float, help="held-out clean run, s (quick 30, full 90)")
    ap.add_argument("--fault-s", type=float, help="each fault run, s (quick 24, full 36)")
    ap.add_argument("--strike-interval-s", type=float, default=1.0, help="a fault strikes about this often")
    ap.add_argument("--warmup-steps", type=int, default=5, help="steps before a run's first measured window")
    ap.add_argument("--covariance-type", default=None, help="detector covariance_type (default: the detector's)")
    ap.add_argument("--threshold-risk", type=float, default=None, help="detector threshold_risk (default: its own)")
    ap.add_argument("--metrics-interval-s", default="1", help="agent metrics_interval_s (default 1 for 2 s windows)")
    ap.add_argument("--agent-env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra agent setting, e.g. OTEL_EACGM_SPAN_SAMPLE_RATIO=1 (repeatable)")
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--analyse-only", action="store_true",
                    help="refit and rescore the runs already recorded in --out (no agent, no workload)")
    ap.add_argument("--release-timeout", type=float, default=90,
                    help="wait at the end for the agent's probe release (so a next benchmark starts clean), s")
    args = ap.parse_args()
    if args.device is None:
        probe = subprocess.run([args.python, "-c", "import torch; print(torch.cuda.is_available())"],
                               capture_output=True, text=True)
        args.device = "cuda" if probe.stdout.strip() == "True" else "cpu"
    if args.train_args is None:
        args.train_args = GPU_TRAIN_ARGS if args.device.startswith("cuda") else "--dim 64 --layers 2 --batch 4 --seq 32"
    args.train_s = args.train_s or (60 if args.quick else 150)
    args.clean_s = args.clean_s or (30 if args.quick else 90)
    args.fault_s = args.fault_s or (24 if args.quick else 36)
    faults = [f for f in args.faults.split(",") if f]
    for f in faults:
        if f not in FAULTS:
            raise SystemExit(f"--faults: {f!r} unknown; expected some of {FAULTS}")
    if args.analyse_only:
        meta = json.loads((args.out / "runs.json").read_text())
        text, result = analyse(args, meta)
        (args.out / "fault_detection.json").write_text(json.dumps(result, indent=1, default=str))
        print(text)
        return
    detector_modules()  # fail before the runs, not after
    for sub in ("logs", "runs", "scores"):
        (args.out / sub).mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    server, store, port = serve()
    launcher = Launcher()
    agent = Agent(["--pid", str(launcher.proc.pid), "--endpoint", f"http://127.0.0.1:{port}", "--insecure"],
                  args.out / "logs" / "agent.log", {"OTEL_EACGM_METRICS_INTERVAL_S": args.metrics_interval_s,
                                                    **dict(kv.split("=", 1) for kv in args.agent_env)}).start()
    print(f"agent ready in {agent.ready_s:.0f} s: {agent.ready_line.split(' ready: ', 1)[-1]}", flush=True)
    runs = [one_run("clean-train", None, args.train_s, None, args, launcher)]
    base_s = runs[0]["step_ms_median"] / 1e3
    every = max(2, round(args.strike_interval_s / base_s))
    print(f"clean-train: {runs[0]['steps']} steps, median {runs[0]['step_ms_median']:.1f} ms; faults every {every} "
          f"steps", flush=True)
    plan = [("clean-heldout", None, args.clean_s)] + [(f, f, args.fault_s) for f in faults]
    for name, fault, seconds in plan:
        runs.append(one_run(name, fault, seconds, every, args, launcher))
        r = runs[-1]
        print(f"{name}: {r['steps']} steps, median {r['step_ms_median']} ms, p95 {r['step_ms_p95']} ms, "
              f"{r['faulty_steps']} faulty", flush=True)
    time.sleep(2 * float(args.metrics_interval_s) + 1)
    stop = agent.stop()
    launcher.close()
    server.stop(1)
    for r in runs:
        r.update(write_run(store, args.out / "runs" / r["name"], r["pid"], agent.pid, r["lo_ns"], r["hi_ns"]))
    meta = {"runs": runs, "agent": stop, "agent_ready_s": agent.ready_s, "collect_wall_s": round(time.monotonic() - t_start, 1),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    (args.out / "runs.json").write_text(json.dumps(meta, indent=1, default=str))
    text, result = analyse(args, meta)
    release_s, released = wait_gone(stop["release_pid"], args.release_timeout)
    result.update(release_wait_s=release_s, released=released, wall_s=round(time.monotonic() - t_start, 1))
    (args.out / "fault_detection.json").write_text(json.dumps(result, indent=1, default=str))
    print(text)
    print(f"probe release {release_s:.0f} s ({'done' if released else 'NOT done'}); wall time {result['wall_s']} s; "
          f"wrote {args.out}/fault_detection.json and fault_detection.md")


def analyse(args: argparse.Namespace, meta: dict) -> tuple[str, dict]:
    """Fit one model per entity kind on clean-train, score every other run; the report."""
    DetectorConfig, fit_rows, save_model, entity_label, score_otlp, windows_from_otlp = detector_modules()
    runs, w_ns = meta["runs"], int(args.window_s * 1e9)
    cfg = DetectorConfig()
    cfg.window_s = args.window_s
    if args.covariance_type:
        cfg.covariance_type = args.covariance_type
    if args.threshold_risk:
        cfg.threshold_risk = args.threshold_risk
    cfg.validate()
    runs_dir = args.out / "runs"
    models, fits = {}, {}
    for kind in KINDS:
        rows = windows_from_otlp(runs_dir / f"clean-train.{kind}.jsonl", cfg)
        if len(rows) < 10:
            print(f"no {kind} model: clean-train has {len(rows)} {kind} windows (< 10)", file=sys.stderr)
            continue
        models[kind] = fit_rows(cfg, rows)
        save_model(args.out / f"model-{kind}.npz", models[kind])
        det = models[kind].detector
        fits[kind] = {"windows": len(rows), "features": len(models[kind].feature_names),
                      "components": int(det.n_components_), "threshold": round(float(det.threshold_), 3),
                      "threshold_method": det.threshold_method_}
        print(f"{kind} model: {fits[kind]}", flush=True)
    results = []
    for r in runs[1:]:
        scored = []
        for kind, model in models.items():
            scored += [(kind, x) for x in score_otlp(runs_dir / f"{r['name']}.{kind}.jsonl", cfg, model)]
        scored.sort(key=lambda kx: kx[1].start_ns)
        with open(args.out / "scores" / f"{r['name']}.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["timestamp", "window_end", "model", "entity", "score", "anomaly", "top_features"])
            for kind, x in scored:
                w.writerow([x.start_ns, x.end_ns, kind, entity_label(x.entity), x.score, int(x.anomalous),
                            ";".join(c.name for c in x.top)])
        flagged = [(k, x) for k, x in scored if x.anomalous]
        first_kind, first = flagged[0] if flagged else (None, None)
        top = [(c.name, c.category, feature_layer(c.name)) for c in first.top] if first else []
        expected = EXPECTED.get(r["fault"] or "", set())
        per_kind = {k: {"scored": sum(1 for kk, _ in scored if kk == k), "anomalous": sum(1 for kk, _ in flagged if kk == k)}
                    for k in models}
        results.append(dict(r, scored_windows=len(scored), flagged_windows=len(flagged), per_model=per_kind,
                            flagged_windows_any=len({x.start_ns for _, x in flagged}),
                            detected=bool(flagged), windows_to_first=(first.start_ns - r["lo_ns"]) // w_ns + 1 if first else None,
                            first_model=first_kind, first_entity=entity_label(first.entity) if first else None,
                            first_score=first.score if first else None, top_features=top,
                            layer_right=any(t[2] in expected for t in top) if first and expected else None))
    clean = [x for x in results if x["fault"] is None]
    clean_h = sum(x["windows"] * args.window_s for x in clean) / 3600
    fa = {k: sum(x["per_model"][k]["anomalous"] for x in clean) for k in models}
    fa_any = sum(x["flagged_windows_any"] for x in clean)
    per_hour = {k: (v / clean_h if clean_h else None) for k, v in fa.items()}
    table = [[x["name"], x["steps"], x["step_ms_median"], x["step_ms_p95"], x["fault_every"], x["spans"], x["points"],
              " / ".join(f"{x['per_model'][k]['anomalous']} of {x['per_model'][k]['scored']}" for k in models),
              "yes" if x["detected"] else "no", x["windows_to_first"], x["first_model"],
              "; ".join(f"{n} ({c}, {lay})" for n, c, lay in x["top_features"]) or None,
              ",".join(sorted(EXPECTED.get(x["fault"] or "", []))) or None, x["layer_right"]] for x in results]
    header = ["run", "steps", "step ms median", "step ms p95", "fault every N steps", "spans", "metric points",
              "anomalous windows (" + " / ".join(models) + ")", "detected", "windows to first anomaly", "model",
              "top features of the first anomaly (category, layer)", "expected layer", "layer right"]
    train, recorded = runs[0], meta["args"]
    text = "\n".join([
        f"# fault detection: device {recorded['device']}, examples/train.py {recorded['train_args']}, "
        f"window {args.window_s} s, "
        f"host {platform.node()} ({os.cpu_count()} CPUs)",
        f"clean-train: {train['steps']} steps (median {train['step_ms_median']:.2f} ms), {train['spans']} spans, "
        f"{train['points']} metric points; models: {fits}", "",
        markdown_table(header, table), "",
        f"false alarms on clean runs ({clean_h * 3600:.0f} s): " + ", ".join(
            f"{k} model {fa[k]} windows = {per_hour[k]:.1f}/h" for k in models)
        + f"; either model {fa_any} windows = {fa_any / clean_h if clean_h else math.nan:.1f}/h",
        "windows to first anomaly: 1 = the run's first measured window (faults strike from the start)",
        f"agent: {meta['agent']['done']}; stop {meta['agent']['stop_s']} s", ""])
    (args.out / "fault_detection.md").write_text(text)
    return text, {"fits": fits, "results": results, "false_alarms": fa, "false_alarms_per_hour": per_hour,
                  "false_alarm_windows_any": fa_any, "clean_s": clean_h * 3600, **{k: meta[k] for k in ("agent", "agent_ready_s")},
                  "args": meta["args"]}


if __name__ == "__main__":
    main()
