"""Does the detector find injected faults in a real traced training job, how fast, and naming what?

One agent (default settings, metrics every second so that 2 s windows have points) traces a
small launcher process and therefore every workload it starts (children of a target are
traced); spans and metrics go to the package's OTLP store in this process. The workload is
examples/train.py, unmodified, with the faults of examples/faults/ (another process for GPU
contention, examples/faults/gpu_contention.py, started beside it and not traced). Runs, each a
fresh process:

1. ``clean-train`` (``--train-s``): the detector's training data;
2. ``--clean-runs`` held-out clean runs (``--clean-s`` each; ``clean-heldout``, or
   ``clean-heldout-1`` ... when more than one): false alarms;
3. one run per fault (``--fault-s`` each): ``gpu-contention``, ``input-stall``,
   ``comm-slowdown``, ``memory-pressure``, ``straggler``. Faults strike every N steps, N chosen so
   that one strike falls about every ``--strike-interval-s`` (from clean-train's median step).
   ``--faults ''`` records clean runs only. ``--budget-s`` starts no run that would end past it.

A run's measured span starts at the first window boundary after ``--warmup-steps`` steps (and,
for GPU contention, after the contending process' kernels run) and ends at the last whole
window. Each run's telemetry in that span (the workload's spans, and the agent's metrics that
are not about another process, from one window earlier) is written as recorded OTLP/JSON lines,
what `otel-eacgm detector fit|score` read: ``OUT/runs/<run>.spans.jsonl`` and
``<run>.metrics.jsonl``, with the timeline in ``OUT/runs.json`` and the logs in ``OUT/logs``.
``--record-only`` stops there. The analysis (``fault_analysis.py``) fits one model per entity
kind on clean-train and scores every other run through the detector's own replay; results:
``OUT/fault_detection.json``, ``.md`` (printed), per-window scores ``OUT/scores/<run>.csv``, the
models ``OUT/model-{spans,metrics}.npz`` and ``OUT/example_anomaly.json`` (one anomaly as the
detector would send it). ``--analyse-only`` analyses recorded folders anywhere, ``--merge``
adds the runs of other folders (the model still fitted on ``--out``'s clean-train), and
``--bundle FILE.tar.gz`` packs ``--out`` into one archive (in parts of ``--bundle-part-mib``)
that comes back from a device command, whose ``$OUT`` returns at most 8 files of 16 MiB.

    sudo $P benchmarks/fault_detection.py --quick --out results/faults          # H200, ~5 min
    sudo $P benchmarks/fault_detection.py --out results/faults                  # ~9 min
    sudo $P benchmarks/fault_detection.py --record-only --faults '' --train-s 60 --clean-runs 2 \\
        --clean-s 180 --budget-s 520 --out /tmp/fdc1 --bundle $OUT/fdc1.tar.gz  # clean runs only
    $P benchmarks/fault_detection.py --analyse-only --out fd1 --merge fdc1 fdc2
"""

from __future__ import annotations

import argparse
import json
import os
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

from agent_session import Agent, wait_gone  # noqa: E402
from fault_analysis import analyse, detector_modules, load_recordings  # noqa: E402
from eacgm_testkit.otlp_store import attrs, serve  # noqa: E402
from run_bundle import MAX_FILES, write_bundle  # noqa: E402

FAULTS = ("gpu-contention", "input-stall", "comm-slowdown", "memory-pressure", "straggler")
GPU_TRAIN_ARGS = "--dim 1024 --layers 4 --batch 32 --seq 512"
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_run(store, stem: Path, pid: int, agent_pid: int, lo: int, hi: int, lead_in_ns: int = 0) -> dict:
    """The run's telemetry in [lo, hi) as OTLP/JSON lines: ``stem.spans.jsonl`` (spans of ``pid``)
    and ``stem.metrics.jsonl`` (the agent's metric points that are not about another process).
    They are two detector entities (the traced process; the agent, which reports every metric),
    so each gets its own model, as `detector serve` gives each entity its own. Returns counts.

    Metric points start ``lead_in_ns`` before ``lo``: a counter's rate needs the point before a
    window, and a series whose first point fell inside the first measured window gave no rate
    there (the detector's new-series rule), which hid window 1 of every fault from the metrics
    model on 2026-12-06. The analysis scores the lead-in window but counts only from ``lo``."""
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
            # The agent exports a process' call statistics under that process' resource (issue
            # 28), in the same request as its own metrics: they are put under the agent's resource
            # here, so the metrics model keeps seeing one entity, as in the earlier runs.
            agent_res = next((rm.resource for rm in req.resource_metrics
                              if attrs(rm.resource.attributes).get("process.pid") == agent_pid), None)
            for rm in req.resource_metrics:
                if agent_res is None or attrs(rm.resource.attributes).get("process.pid") not in (agent_pid, pid):
                    continue
                nrm = out.resource_metrics.add()
                nrm.resource.CopyFrom(agent_res)
                for sm in rm.scope_metrics:
                    nsm = nrm.scope_metrics.add()
                    nsm.scope.CopyFrom(sm.scope)
                    for m in sm.metrics:
                        kind = m.WhichOneof("data")
                        pts = [p for p in getattr(m, kind).data_points if lo - lead_in_ns <= p.time_unix_nano < hi
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


def start_hog(args: argparse.Namespace, name: str, seconds: float) -> subprocess.Popen:
    """Start the GPU contention beside the workload and return once its kernels run: its
    interpreter, PyTorch and CUDA take seconds to start (4.5 s on the H100 of 2026-12-06, two
    whole windows), and a measured span that began before would count them against the detector."""
    hog_log = args.out / "logs" / f"{name}-hog.log"
    argv = [args.python, str(REPO / "examples/faults/gpu_contention.py"), "--device", args.device,
            "--seconds", str(seconds + args.start_timeout + 10)] + (["--size", "256"] if args.device == "cpu" else [])
    hog = subprocess.Popen(argv, stdout=open(hog_log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    t0 = time.monotonic()
    while "gpu_contention: running" not in hog_log.read_text(errors="replace"):
        if hog.poll() is not None or time.monotonic() - t0 > args.start_timeout:
            hog.kill()
            raise RuntimeError(f"{name}: the contention did not start in {time.monotonic() - t0:.0f} s; "
                               f"see {hog_log}:\n{hog_log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)
    return hog


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
    hog = start_hog(args, name, seconds) if fault == "gpu-contention" else None
    warm_steps = len(steps_of(log))
    w_ns = int(args.window_s * 1e9)
    lo = (time.time_ns() // w_ns + 1) * w_ns
    hi = lo + max(1, round(seconds / args.window_s)) * w_ns
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


def parse_args() -> argparse.Namespace:
    """The command line, checked; run lengths and model flags resolved for recording."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="60 s training, 30 s clean, 24 s per fault (~5 min; full: 150, 90, 36 s, ~9 min)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if the workload's torch sees a GPU)")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the workload")
    ap.add_argument("--train-args", help=f"model flags for examples/train.py (default on CUDA: {GPU_TRAIN_ARGS!r})")
    ap.add_argument("--faults", default=",".join(FAULTS), help="comma-separated; '' records clean runs only")
    ap.add_argument("--window-s", type=float, default=None, help="detector window, s (default 2; analysis: as recorded)")
    ap.add_argument("--train-s", type=float, help="clean training run, s (quick 60, full 150)")
    ap.add_argument("--clean-s", type=float, help="each held-out clean run, s (quick 30, full 90)")
    ap.add_argument("--clean-runs", type=int, default=1,
                    help="held-out clean runs, each a fresh process of --clean-s (default 1)")
    ap.add_argument("--fault-s", type=float, help="each fault run, s (quick 24, full 36)")
    ap.add_argument("--strike-interval-s", type=float, default=1.0, help="a fault strikes about this often")
    ap.add_argument("--warmup-steps", type=int, default=5, help="steps before a run's first measured window")
    ap.add_argument("--covariance-type", default=None, help="detector covariance_type (default: the detector's)")
    ap.add_argument("--threshold-risk", type=float, default=None, help="detector threshold_risk (default: its own)")
    ap.add_argument("--metrics-interval-s", default="1", help="agent metrics_interval_s (default 1 for 2 s windows)")
    ap.add_argument("--agent-env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra agent setting, e.g. OTEL_EACGM_SPAN_SAMPLE_RATIO=1 (repeatable)")
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no run that would end later than this many seconds after the start (a device "
                         "command's limit, less the writing, analysis, bundle and probe release after the runs)")
    ap.add_argument("--record-only", action="store_true",
                    help="record the runs (runs/, runs.json, logs/) and stop: no model, no scores")
    ap.add_argument("--analyse-only", action="store_true",
                    help="fit and score the runs already recorded in --out (no agent, no workload)")
    ap.add_argument("--fit-on", choices=("clean-train", "clean-runs"), default="clean-train",
                    help="analysis: fit on the first folder's clean-train and score every other run (default), or "
                         "on every clean run, each clean run scored by a model fitted on the others")
    ap.add_argument("--merge", type=Path, nargs="+", default=[], metavar="DIR",
                    help="with --analyse-only: also score the runs recorded in these folders (their clean runs, "
                         "clean-train too, count as held-out); the model is fitted on --out's clean-train")
    ap.add_argument("--bundle", type=Path, metavar="FILE.tar.gz",
                    help="at the end, pack --out (recordings, runs.json, logs, results) into this archive, cut "
                         "into FILE.000, FILE.001, ... past --bundle-part-mib")
    ap.add_argument("--bundle-part-mib", type=float, default=15, help="largest bundle file, MiB (default 15)")
    ap.add_argument("--release-timeout", type=float, default=90,
                    help="wait at the end for the agent's probe release (so a next benchmark starts clean), s")
    args = ap.parse_args()
    if args.record_only and args.analyse_only:
        raise SystemExit("--record-only and --analyse-only exclude each other; give one")
    if args.merge and not args.analyse_only:
        raise SystemExit(f"--merge {' '.join(map(str, args.merge))}: only with --analyse-only")
    if args.clean_runs < 0:
        raise SystemExit(f"--clean-runs {args.clean_runs}: expected >= 0")
    if args.bundle_part_mib <= 0:
        raise SystemExit(f"--bundle-part-mib {args.bundle_part_mib}: expected > 0")
    args.faults = [f for f in args.faults.split(",") if f]
    for f in args.faults:
        if f not in FAULTS:
            raise SystemExit(f"--faults: {f!r} unknown; expected some of {FAULTS}")
    if args.analyse_only:
        for folder in [args.out, *args.merge]:
            if not (folder / "runs.json").is_file():
                raise SystemExit(f"{folder}: no runs.json; give the folder a recording wrote (for a bundle, "
                                 f"the folder it unpacks to: mkdir D && tar xzf FILE.tar.gz -C D, then D/<name>)")
        return args
    args.window_s = args.window_s or 2.0
    if args.device is None:
        probe = subprocess.run([args.python, "-c", "import torch; print(torch.cuda.is_available())"],
                               capture_output=True, text=True)
        args.device = "cuda" if probe.stdout.strip() == "True" else "cpu"
    if args.train_args is None:
        args.train_args = GPU_TRAIN_ARGS if args.device.startswith("cuda") else "--dim 64 --layers 2 --batch 4 --seq 32"
    args.train_s = args.train_s or (60 if args.quick else 150)
    args.clean_s = args.clean_s or (30 if args.quick else 90)
    args.fault_s = args.fault_s or (24 if args.quick else 36)
    return args


def record(args: argparse.Namespace, t_start: float) -> tuple[dict, int]:
    """Run clean-train, the held-out clean runs and the faults under one agent; write each
    run's recordings and ``runs.json``. Returns the run timeline and the agent's release pid."""
    for sub in ("logs", "runs"):
        (args.out / sub).mkdir(parents=True, exist_ok=True)
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
    clean = ["clean-heldout"] if args.clean_runs == 1 else [f"clean-heldout-{i}" for i in range(1, args.clean_runs + 1)]
    plan = [(n, None, args.clean_s) for n in clean] + [(f, f, args.fault_s) for f in args.faults]
    skipped = []
    for name, fault, seconds in plan:
        # A run costs its measured span plus the start-up before it (the slowest seen so far).
        need = time.monotonic() - t_start + seconds + max(r["start_s"] for r in runs)
        if args.budget_s and need > args.budget_s:
            skipped.append(name)
            continue
        runs.append(one_run(name, fault, seconds, every, args, launcher))
        r = runs[-1]
        print(f"{name}: {r['steps']} steps, median {r['step_ms_median']} ms, p95 {r['step_ms_p95']} ms, "
              f"{r['faulty_steps']} faulty", flush=True)
    if skipped:
        print(f"--budget-s {args.budget_s:g}: not run {', '.join(skipped)}", flush=True)
    time.sleep(2 * float(args.metrics_interval_s) + 1)
    stop = agent.stop()
    launcher.close()
    server.stop(1)
    for r in runs:
        r.update(write_run(store, args.out / "runs" / r["name"], r["pid"], agent.pid, r["lo_ns"], r["hi_ns"],
                           lead_in_ns=int(args.window_s * 1e9)))
    meta = {"runs": runs, "skipped": skipped, "agent": stop, "agent_ready_s": agent.ready_s,
            "collect_wall_s": round(time.monotonic() - t_start, 1),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    (args.out / "runs.json").write_text(json.dumps(meta, indent=1, default=str))
    return meta, stop["release_pid"]


def main() -> None:
    args = parse_args()
    t_start = time.monotonic()
    detector_modules()  # fail before the runs, not after
    release_pid = None
    if args.analyse_only:
        meta, runs = load_recordings(args.out, args.merge)
        args.window_s = args.window_s or meta["args"]["window_s"]
    else:
        meta, release_pid = record(args, t_start)
        runs = load_recordings(args.out, [])[1]
    result = {}
    if not args.record_only:
        text, result = analyse(args, meta, runs)
        print(text)
    if release_pid is not None:
        release_s, released = wait_gone(release_pid, args.release_timeout)
        result.update(release_wait_s=release_s, released=released)
        print(f"probe release {release_s:.0f} s ({'done' if released else 'NOT done'})")
    elif not args.analyse_only:
        print("probe release: the agent left no release child")
    result["wall_s"] = round(time.monotonic() - t_start, 1)
    if not args.record_only:
        (args.out / "fault_detection.json").write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {args.out}/fault_detection.json, fault_detection.md, example_anomaly.json")
    else:
        print(f"recorded {len(meta['runs'])} runs in {args.out} (runs.json, runs/, logs/)")
    if args.bundle:
        files = write_bundle(args.out, args.bundle, int(args.bundle_part_mib * (1 << 20)))
        size = sum(f.stat().st_size for f in files) / (1 << 20)
        join = f"cat {args.bundle}.* | tar xz -C DIR" if len(files) > 1 else f"tar xzf {args.bundle} -C DIR"
        print(f"bundle: {', '.join(map(str, files))} ({size:.1f} MiB); unpack: {join}"
              + (f"; WARNING: {len(files)} files, a device command returns at most {MAX_FILES}" if len(files) > MAX_FILES else ""))
    print(f"wall time {result['wall_s']} s")


if __name__ == "__main__":
    main()
