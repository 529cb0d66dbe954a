"""The end-to-end stack, every part a real process on loopback.

    examples/cuda_steps.py --uprobes--> otel-eacgm agent --OTLP--> collector --> otel-eacgm detector
                                                                       ^               |
    Jaeger, Zipkin, VictoriaLogs, the tests' OTLP store <-- annotated spans, anomaly logs

The collector runs collector-config/detector-pipeline.yaml; the detector
tests/fixtures/detector-e2e.yaml; Jaeger collector-config/jaeger-local.yaml; Zipkin (traces, its
Lens UI) and VictoriaLogs (the anomaly logs) their defaults, in memory and under the run's folder. Shutdown is in
data-flow order and waits on counters, not on sleeps: the agent exits once the collector has
every span, the detector is stopped once the collector's counters say it has sent it every span
(stopping scores the still-open windows and flushes the output), and the collector is stopped
last (it flushes its batches). Jaeger, Zipkin and VictoriaLogs stay up for the tests that query them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agent_run import agent_cmd, summary
from collector_build import REPO, collector_binary, jaeger_binary, victorialogs_binary, zipkin_jar
from loopback import free_port
from eacgm_testkit.otlp_store import Store, serve

SERVICE = "eacgm-e2e"
#: The workload's plan: ~20 steps/s; the clean steps before the fault outlast the detector's
#: warm-up (16 windows of 0.5 s, tests/fixtures/detector-e2e.yaml) by a few scored windows,
#: the fault fills about five windows, clean steps follow. 50 fault steps sleep at least
#: 49 x 50 ms between the first's start and the last's end, so at least three whole windows lie
#: inside the fault wherever the window edges fall (40 steps could leave two: CI saw it once).
STEPS, COMM_FAULT = 290, range(201, 251)
WINDOW_NS = 500_000_000
WORKLOAD = REPO / "examples/cuda_steps.py"
OTEL_EACGM = str(REPO / ".venv/bin/otel-eacgm")
PORTS = ("EACGM_COLLECTOR_GRPC_PORT", "EACGM_COLLECTOR_HTTP_PORT", "EACGM_COLLECTOR_METRICS_PORT",
         "EACGM_DETECTOR_PORT", "EACGM_DETECTED_PORT", "EACGM_JAEGER_OTLP_PORT", "EACGM_JAEGER_UI_PORT",
         "EACGM_JAEGER_QUERY_GRPC_PORT", "EACGM_ZIPKIN_PORT", "EACGM_VICTORIALOGS_PORT")


class Service:
    """A long-running process of the stack, its output in NAME.log."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)

    def tail(self, chars: int = 3000) -> str:
        """The end of its log, for failure messages."""
        return self.log.read_text(errors="replace")[-chars:]

    def wait_port(self, port: int, timeout_s: float = 30) -> None:
        """Wait until it listens on 127.0.0.1:port; fail at once, with its log, if it exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with status {self.proc.returncode}:\n{self.tail()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.1)
        raise AssertionError(f"{self.name} does not listen on {port} after {timeout_s} s:\n{self.tail()}")

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM and wait (each part flushes what it holds on SIGTERM); its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"{self.name} did not stop within {timeout_s} s:\n{self.tail()}") from None
        return self.proc.returncode


def collector_counter(port: int, metric: str, exporter: str) -> float:
    """One of the collector's own Prometheus counters (0 before its first increment)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    pattern = rf'^{re.escape(metric)}{{[^}}]*exporter="{re.escape(exporter)}"[^}}]*}} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, re.M))


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll predicate until it holds; fail naming what was awaited."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


@dataclass
class Run:
    """What a finished pipeline run left for the tests to check."""

    store: Store
    jaeger_ui: str
    zipkin_ui: str               # Zipkin's base URL: Lens at /zipkin/, API at /api/v2/
    victorialogs: str            # VictoriaLogs' base URL: LogsQL at /select/logsql/, UI at /select/vmui/
    steps: list[dict]            # the workload's own record, one dict per step (cuda_steps --json)
    pid: int                     # the workload's process id (cProfile runs it in-process)
    agent: subprocess.CompletedProcess
    agent_counters: dict[str, int]
    detector_log: str
    log_dir: Path

    def spans(self) -> list[dict]:
        """The spans of the traced workload process, as the store received them."""
        return [s for s in self.store.spans() if s["resource"].get("process.pid") == self.pid]

    def anomaly_events(self) -> list[dict]:
        """The detector's anomaly log records about the workload process."""
        return [r for r in self.store.log_records()
                if r["event_name"] == "eacgm.anomaly" and r["attributes"].get("process.pid") == str(self.pid)]


def start_zipkin(port: int, env: dict[str, str], log_dir: Path) -> Service:
    """Zipkin's server (in-memory storage, Lens UI) on port (QUERY_PORT; it listens on every
    interface: the tests reach it on loopback)."""
    return Service("zipkin", ["java", "-Xmx512m", "-jar", str(zipkin_jar())],
                   dict(env, QUERY_PORT=str(port)), log_dir)


def start_victorialogs(port: int, env: dict[str, str], log_dir: Path) -> Service:
    """VictoriaLogs on 127.0.0.1:port, its data under log_dir."""
    return Service("victorialogs", [str(victorialogs_binary()), f"-httpListenAddr=127.0.0.1:{port}",
                                    f"-storageDataPath={log_dir / 'victorialogs-data'}", "-retentionPeriod=100y"],
                   env, log_dir)


def _agent_run(endpoint: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Trace cuda_steps.py at 100 % sampling: CUDA runtime and NCCL calls under a Python span
    per step (cProfile makes CPython 3.11 fire its function-entry probes)."""
    workload = [sys.executable, "-m", "cProfile", "-o", os.devnull, str(WORKLOAD), "--json",
                "--steps", str(STEPS), "--comm-fault", f"{COMM_FAULT.start}:{COMM_FAULT.stop - 1}"]
    cmd = agent_cmd(endpoint, "--layers", "cuda.runtime,nccl,python", "--launch-layer", "cuda.runtime", "--",
                    *workload)
    agent_env = dict(env, OTEL_SERVICE_NAME=SERVICE, OTEL_EACGM_SPAN_SAMPLE_RATIO="1",
                     OTEL_EACGM_METRICS_INTERVAL_S="1", OTEL_EACGM_PYTHON_INCLUDE="cuda_steps:step",
                     OTEL_EACGM_PYTHON_DEFAULT_INCLUDE="false")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=agent_env)


@contextlib.contextmanager
def pipeline_run(log_dir: Path) -> Iterator[Run]:
    """Run the whole stack on the workload's plan; yield the run with Jaeger still serving."""
    server, store, store_port = serve()
    ports = {name: free_port() for name in PORTS} | {"EACGM_STORE_PORT": store_port}
    env = dict(os.environ, **{k: str(v) for k, v in ports.items()})
    services: list[Service] = []
    try:
        jaeger = Service("jaeger", [str(jaeger_binary()), "--config", str(REPO / "collector-config/jaeger-local.yaml")],
                         env, log_dir)
        services.append(jaeger)
        services.append(zipkin := start_zipkin(ports["EACGM_ZIPKIN_PORT"], env, log_dir))
        services.append(victorialogs := start_victorialogs(ports["EACGM_VICTORIALOGS_PORT"], env, log_dir))
        detector = Service("detector", [OTEL_EACGM, "detector", "serve",
                                        "--config", str(REPO / "tests/fixtures/detector-e2e.yaml"),
                                        "--listen", f"127.0.0.1:{ports['EACGM_DETECTOR_PORT']}",
                                        "--export-endpoint", f"127.0.0.1:{ports['EACGM_DETECTED_PORT']}"],
                           env, log_dir)
        services.append(detector)
        for svc, port in ((jaeger, "EACGM_JAEGER_OTLP_PORT"), (jaeger, "EACGM_JAEGER_UI_PORT"),
                          (detector, "EACGM_DETECTOR_PORT"), (victorialogs, "EACGM_VICTORIALOGS_PORT")):
            svc.wait_port(ports[port])
        zipkin.wait_port(ports["EACGM_ZIPKIN_PORT"], timeout_s=180)  # a JVM: seconds to start
        # Started once its destinations listen: it would otherwise begin in gRPC's reconnect back-off.
        collector = Service("collector", [str(collector_binary()), "--config",
                                          str(REPO / "collector-config/detector-pipeline.yaml")], env, log_dir)
        services.append(collector)
        for port in ("EACGM_COLLECTOR_GRPC_PORT", "EACGM_COLLECTOR_METRICS_PORT"):
            collector.wait_port(ports[port])

        agent = _agent_run(f"http://127.0.0.1:{ports['EACGM_COLLECTOR_GRPC_PORT']}", env)
        assert agent.returncode == 0, agent.stderr[-3000:]
        counters = summary(agent.stderr)
        metrics_port = ports["EACGM_COLLECTOR_METRICS_PORT"]
        wait_until(lambda: collector_counter(metrics_port, "otelcol_exporter_sent_spans", "otlp_grpc/detector")
                   >= counters["exported"], 30, f"the collector to send the detector {counters['exported']} spans")
        assert detector.stop() == 0, detector.tail()
        assert collector.stop() == 0, collector.tail()
        records = [json.loads(line) for line in agent.stdout.splitlines() if line.startswith("{")]
        pid = int(agent.stderr.split("launched pid ", 1)[1].split(":", 1)[0])
        yield Run(store, f"http://127.0.0.1:{ports['EACGM_JAEGER_UI_PORT']}",
                  f"http://127.0.0.1:{ports['EACGM_ZIPKIN_PORT']}", f"http://127.0.0.1:{ports['EACGM_VICTORIALOGS_PORT']}",
                  records, pid, agent, counters, detector.log.read_text(), log_dir)
    finally:
        for svc in reversed(services):
            svc.stop()
        server.stop(0)
