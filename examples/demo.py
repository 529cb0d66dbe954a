"""`make demo`: the agent on an example workload, end to end, on this machine.

    workload  --uprobes-->  otel-eacgm agent  --OTLP-->  OpenTelemetry Collector  --OTLP-->  Jaeger
                                                                               \\--zipkin-->  Zipkin (Lens UI)
                                                                               \\--OTLP logs->  VictoriaLogs
                                                                               \\--OTLP-->  summary (this script)

Starts the real Collector (collector-config/demo.yaml), a local Jaeger
(collector-config/jaeger-local.yaml), Zipkin (scripts/fetch-zipkin.sh, its Lens UI) and
VictoriaLogs (scripts/build-victorialogs.sh, its web UI), runs `otel-eacgm agent -- <workload>`
and prints the spans as they arrive (calls per layer, errors), then the slowest calls, the
metrics received, what the anomaly detector found, and where to look. The workload is
examples/train.py on a GPU when PyTorch sees one, otherwise examples/cuda_steps.py (real
libcudart/libnccl calls that fail without a GPU), with a fault injected after the detector's
warm-up: a communication slowdown (steps 201-250 of cuda_steps.py) or one straggler step (step
250 of train.py). The detector (eacgm_detector, the same code `otel-eacgm detector serve` runs)
is fed the spans the demo received, warms up on the first windows and scores the rest; the demo
names the windows it flags and whether they are the injected fault's. Run in a terminal, the
demo keeps the backends up until Ctrl-C and prints their addresses; otherwise (or with
--no-keep) it stops them, and prints no address that would be dead. Needs root (eBPF).

    .venv/bin/python examples/demo.py [--steps 300] [--keep|--no-keep] [--workload auto|train|cuda-steps]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from eacgm_testkit.otlp_store import Store, serve  # noqa: E402

SERVICE = "eacgm-demo"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, what: str, proc: subprocess.Popen, log: Path, timeout_s: float = 30) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"demo: {what} exited with status {proc.returncode}; its log:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    sys.exit(f"demo: {what} does not listen on port {port} after {timeout_s:.0f} s; see {log}")


def built(script: str) -> Path:
    """Build (first time) and locate a cached binary through scripts/build-*.sh."""
    subprocess.run(["bash", str(REPO / "scripts" / script)], check=True)
    out = subprocess.run(["bash", str(REPO / "scripts" / script), "--path"], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def start_zipkin_and_victorialogs(env: dict[str, str], zipkin_port: int, vl_port: int, workdir: Path,
                                  procs: list[subprocess.Popen]) -> None:
    """Zipkin (in memory; a JVM, seconds to start) and VictoriaLogs (data under workdir), the
    collector's trace UI and log store, added to `procs` as each starts (so that they are
    stopped even if the other never listens); both listening when this returns."""
    zlog, vlog = workdir / "zipkin.log", workdir / "victorialogs.log"
    zipkin = subprocess.Popen(["java", "-Xmx512m", "-jar", str(built("fetch-zipkin.sh"))],
                              env=dict(env, QUERY_PORT=str(zipkin_port)), stdout=zlog.open("wb"),
                              stderr=subprocess.STDOUT)
    procs.append(zipkin)
    vl = subprocess.Popen([str(built("build-victorialogs.sh")), f"-httpListenAddr=127.0.0.1:{vl_port}",
                           f"-storageDataPath={workdir / 'victorialogs-data'}"], env=env, stdout=vlog.open("wb"),
                          stderr=subprocess.STDOUT)
    procs.append(vl)
    wait_port(vl_port, "VictoriaLogs", vl, vlog)
    wait_port(zipkin_port, "Zipkin", zipkin, zlog, timeout_s=180)


# The detector as the demo runs it: short windows and the shortest warm-up the config allows
# (as tests/fixtures/detector-e2e.yaml), so a run of a few seconds learns the workload and then
# scores it. The fault starts once the warm-up (16 windows of 0.5 s, ~160 steps) is over.
DETECTOR = {"window_s": 0.5, "grace_s": 1.0, "warmup_windows": 16, "refit_every": 1000}
FAULT_STEPS = range(201, 251)


def stop_all(procs: list[subprocess.Popen], grace_s: float) -> None:
    """Stop the backends together: each is asked to stop at once, and those not gone within
    `grace_s` in all are killed (one by one, a slow one made the demo's exit wait 10 s each)."""
    for proc in procs:
        proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def pick_workload(choice: str, steps: int) -> tuple[list[str], str]:
    """(command, launch layer) of the example workload, with its fault after the warm-up."""
    python = sys.executable
    if choice in ("auto", "train"):
        probe = subprocess.run([python, "-c", "import torch; print(torch.cuda.is_available())"],
                               capture_output=True, text=True)
        if probe.stdout.strip() == "True" or choice == "train":
            return [python, str(REPO / "examples/train.py"), "--steps", str(steps), "--fault", "straggler",
                    "--fault-every", "250"], "cuda.driver"
    # No GPU: real libcudart calls; the runtime layer, since there is no libcuda to trace.
    return [python, str(REPO / "examples/cuda_steps.py"), "--steps", str(steps),
            "--comm-fault", f"{FAULT_STEPS.start}:{FAULT_STEPS.stop - 1}"], "cuda.runtime"


def detect(store: Store) -> list:
    """The detector's results for the traces the demo received, in arrival order (as the
    collector would have sent them), every window closed at the end."""
    from eacgm_detector.config import DetectorConfig  # noqa: PLC0415 - the detector's own code
    from eacgm_detector.pipeline import Detector  # noqa: PLC0415

    det = Detector(DetectorConfig(**DETECTOR).validate())
    results = []
    with store._lock:  # noqa: SLF001 - the demo's own store
        requests = list(store.traces)
    for req in requests:
        det.add_traces(req)
        results += det.ready()
    return results + det.drain()


def report_anomalies(results: list, fault_ns: tuple[int, int] | None, fault: str) -> None:
    """What the detector found: each flagged window, its score and top features, and whether it
    lies in the injected fault."""
    scored = [r for r in results if r.score is not None]
    flagged = [r for r in scored if r.anomalous]
    print(f"detector: {len(results) - len(scored)} windows of {DETECTOR['window_s']} s to warm up, "
          f"{len(scored)} scored, {len(flagged)} anomalous")
    for r in flagged:
        start = time.strftime("%H:%M:%S", time.localtime(r.start_ns / 1e9)) + f".{r.start_ns % 10**9 // 10**6:03d}"
        inside = fault_ns is not None and r.start_ns < fault_ns[1] and r.end_ns > fault_ns[0]
        features = ", ".join(f"{c.name} ({c.value:.3g})" for c in r.top[:3])
        print(f"  ANOMALY at {start}, {(r.end_ns - r.start_ns) / 1e9:.1f} s window: score {r.score:.1f} below "
              f"{r.threshold:.1f}; top features: {features}" + ("  <- the injected fault" if inside else ""))
    if fault_ns is not None:
        found = any(r.start_ns < fault_ns[1] and r.end_ns > fault_ns[0] for r in flagged)
        print(f"injected fault: {fault}: "
              + ("found by the detector" if found else "NOT found by the detector"))


def live_summary(store: Store, stop: threading.Event, progress: list[str]) -> None:
    """A status line a second while it changes: spans so far per layer, errors, the workload's last step."""
    tty = sys.stdout.isatty()
    last = ""
    while not stop.wait(1.0):
        spans = store.spans()
        layers = collections.Counter(s["attributes"].get("eacgm.layer", "?") for s in spans)
        errors = sum(1 for s in spans if s["status_code"] == 2)
        per_layer = ", ".join(f"{k} {v}" for k, v in sorted(layers.items())) or "none yet"
        line = f"  [{progress[-1] if progress else 'starting'}] spans: {len(spans)} ({per_layer}); errors {errors}"
        if line != last:
            print(f"\r{line:100}" if tty else line, end="" if tty else "\n", flush=True)
            last = line


def report(store: Store, jaeger_ui: str | None) -> None:
    spans = [s for s in store.spans() if s["resource"].get("service.name") == SERVICE]
    print(f"\n\nspans received: {len(spans)} from service {SERVICE!r}")
    by = collections.Counter((s["attributes"].get("eacgm.layer"), s["name"]) for s in spans)
    errs = collections.Counter(s["name"] for s in spans if s["status_code"] == 2)
    print(f"  {'layer':14} {'call':28} {'count':>6} {'errors':>6}")
    for (layer, name), n in sorted(by.items()):
        print(f"  {layer:14} {name:28} {n:6d} {errs.get(name, 0):6d}")
    timed = sorted((s for s in spans if s["end"] > s["start"]), key=lambda s: s["start"] - s["end"])[:5]
    print("slowest calls:")
    for s in timed:
        a = s["attributes"]
        detail = a.get("cuda.kernel.name") or a.get("nccl.collective") or a.get("error.type") or ""
        print(f"  {(s['end'] - s['start']) / 1e6:9.3f} ms  {s['name']:24} {detail}")
    points = store.metric_points()
    metrics = collections.Counter(p["name"] for p in points)
    print(f"metrics received: {len(metrics)} names, e.g. " + ", ".join(sorted(metrics)[:8]))
    calls = [p for p in points if p["name"] == "eacgm.calls"
             and p["attributes"].get("code.function.name") == "cudaLaunchKernel"]
    if calls:
        print(f"  eacgm.calls{{cudaLaunchKernel}} = {max(p['value'] for p in calls)} (counted from every call)")
    if jaeger_ui:
        url = f"{jaeger_ui}/api/traces?service={SERVICE}&limit=1000"
        with urllib.request.urlopen(url, timeout=10) as resp:
            traces = json.load(resp)["data"]
        print(f"Jaeger holds {len(traces)} traces of {SERVICE!r}")


def jaeger_address(jaeger_ui: str) -> str:
    """The address to open: the UI where this Jaeger build has one, else its query API."""
    with urllib.request.urlopen(f"{jaeger_ui}/", timeout=10) as resp:
        has_ui = "not the Jaeger UI you are looking for" not in resp.read().decode()
    if has_ui:
        return f"{jaeger_ui}/search?service={SERVICE}"
    return (f"{jaeger_ui}/api/traces?service={SERVICE}&limit=20 (query API; this Jaeger build has no UI: set "
            "EACGM_JAEGER_UI_ASSETS to a jaeger-ui build directory)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300, help="workload steps (the detector warms up on ~160)")
    ap.add_argument("--workload", choices=["auto", "train", "cuda-steps"], default="auto")
    ap.add_argument("--keep", action=argparse.BooleanOptionalAction, default=None,
                    help="keep the collector, Jaeger, Zipkin and VictoriaLogs running until Ctrl-C "
                         "(default: when stdin is a terminal)")
    ap.add_argument("--ui-port", type=int, default=16686, help="Jaeger UI / query API port")
    ap.add_argument("--zipkin-port", type=int, default=9411, help="Zipkin (Lens UI and API) port")
    ap.add_argument("--victorialogs-port", type=int, default=9428, help="VictoriaLogs (UI and query API) port")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("demo: eBPF needs root: run `sudo make demo`")
    collector = built("build-collector.sh")
    jaeger = built("build-jaeger.sh")
    workdir = Path(tempfile.mkdtemp(prefix="otel-eacgm-demo-"))
    server, store, store_port = serve()
    ports = {"EACGM_COLLECTOR_GRPC_PORT": free_port(), "EACGM_COLLECTOR_HTTP_PORT": free_port(),
             "EACGM_STORE_PORT": store_port, "EACGM_JAEGER_OTLP_PORT": free_port(),
             "EACGM_JAEGER_UI_PORT": args.ui_port, "EACGM_JAEGER_QUERY_GRPC_PORT": free_port(),
             "EACGM_ZIPKIN_PORT": args.zipkin_port, "EACGM_VICTORIALOGS_PORT": args.victorialogs_port}
    env = dict(os.environ, **{k: str(v) for k, v in ports.items()})
    procs: list[subprocess.Popen] = []
    try:
        jlog = workdir / "jaeger.log"
        procs.append(subprocess.Popen([str(jaeger), "--config", str(REPO / "collector-config/jaeger-local.yaml")],
                                      env=env, stdout=jlog.open("wb"), stderr=subprocess.STDOUT))
        wait_port(args.ui_port, "Jaeger", procs[-1], jlog)
        start_zipkin_and_victorialogs(env, args.zipkin_port, args.victorialogs_port, workdir, procs)
        clog = workdir / "collector.log"
        procs.append(subprocess.Popen([str(collector), "--config", str(REPO / "collector-config/demo.yaml")],
                                      env=env, stdout=clog.open("wb"), stderr=subprocess.STDOUT))
        wait_port(ports["EACGM_COLLECTOR_GRPC_PORT"], "the collector", procs[-1], clog)
        jaeger_ui = f"http://127.0.0.1:{args.ui_port}"
        command, layer = pick_workload(args.workload, args.steps)
        agent = [str(Path(sys.executable).parent / "otel-eacgm"), "agent", "--insecure", "--launch-layer", layer,
                 "--endpoint", f"http://127.0.0.1:{ports['EACGM_COLLECTOR_GRPC_PORT']}", "--", *command]
        print(f"collector: otlp grpc 127.0.0.1:{ports['EACGM_COLLECTOR_GRPC_PORT']} -> Jaeger {jaeger_ui} + summary")
        print(f"agent:     {' '.join(agent)}")
        alog = workdir / "agent.log"
        progress: list[str] = []
        stop = threading.Event()
        ticker = threading.Thread(target=live_summary, args=(store, stop, progress), daemon=True)
        ticker.start()
        run = subprocess.Popen(agent, env=dict(env, OTEL_SERVICE_NAME=SERVICE, OTEL_EACGM_METRICS_INTERVAL_S="2",
                                        OTEL_EACGM_SPAN_SAMPLE_RATIO="1"),  # a demo shows every span,
                               stdout=subprocess.PIPE, stderr=alog.open("wb"), text=True)
        fault: list[int] = []  # wall-clock ns of the first and last faulty step lines
        for line in run.stdout:
            progress.append(line.strip())
            if "fault" in line:
                now = time.time_ns()
                fault = [fault[0] if fault else now, now]
        status = run.wait()
        stop.set()
        ticker.join()
        done = [line for line in alog.read_text().splitlines() if " done: " in line]
        print(f"\nagent exit {status}; " + (done[-1].split(" done: ", 1)[1] if done else f"no summary, see {alog}"))
        store.wait_for(lambda: len(store.spans()) > 0, 5)
        time.sleep(1.5)  # the collector's batch timeout: the last spans are on their way
        report(store, jaeger_ui)
        print(f"logs: {workdir}")
        injected = "a straggler step every 250 steps" if "examples/train.py" in " ".join(command) else \
            f"communication slowdown, steps {FAULT_STEPS.start}-{FAULT_STEPS.stop - 1}"
        report_anomalies(detect(store), (fault[0] - 10**8, fault[-1] + 10**8) if fault else None, injected)
        keep = sys.stdin.isatty() if args.keep is None else args.keep
        if keep:
            print(f"Jaeger: {jaeger_address(jaeger_ui)}")
            print(f"Zipkin (Lens UI): http://127.0.0.1:{args.zipkin_port}/zipkin/?serviceName={SERVICE}")
            print(f"VictoriaLogs (UI): http://127.0.0.1:{args.victorialogs_port}/select/vmui/ "
                  "(the detector's eacgm.anomaly records, where a detector sends its output to this collector)")
            try:  # the line is printed inside: a Ctrl-C right after it must land here, not in a traceback
                print("collector, Jaeger, Zipkin and VictoriaLogs keep running until Ctrl-C", flush=True)
                while True:  # short sleeps: a Ctrl-C that another thread (gRPC's) receives wakes no
                    time.sleep(0.5)  # sleep, and Python raises it in this thread only when it runs again
            except KeyboardInterrupt:
                pass
        else:
            print("the backends stopped with the demo (stdin is not a terminal); --keep keeps them up until Ctrl-C")
        return status
    finally:
        stop_all(procs, grace_s=10.0)
        server.stop(0)


if __name__ == "__main__":
    sys.exit(main())
