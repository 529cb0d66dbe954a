"""The detector's scale-out behind the Collector's loadbalancing exporter, every part a real
process on loopback:

    simulated agents (6 hosts x 2 processes) --OTLP--> gateway collector (loadbalancing,
    static resolver, routing by entity) --> N `otel-eacgm detector serve` replicas
    --> backends collector (test-pipeline.yaml) --> the tests' OTLP store

The gateway runs collector-config/gateway-loadbalancing.yaml, the replicas
tests/fixtures/detector-scaleout.yaml, each named by its instance_id (service.instance.id on
its output) so the store shows which replica scored which entity. Shutdown waits on the
gateway's counters and then on the store: the replicas are stopped (which scores their open
windows) once the gateway has taken every span the agents sent and the replicas' output has
stopped growing (the gateway's counters count a batch as sent once it is in its replica's
queue, not once the replica has it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from collector_build import REPO, collector_binary
from e2e_stack import Service, collector_counter, wait_until
from loopback import free_port
from eacgm_testkit.otlp_store import Store, serve

OTEL_EACGM = str(REPO / ".venv/bin/otel-eacgm")
DETECTOR_CONFIG = REPO / "tests/fixtures/detector-scaleout.yaml"
#: Simulated hosts and their processes: 12 entities, (node<k>, pid 1000+rank), ranks 2k and 2k+1.
HOSTS = [[2 * h, 2 * h + 1] for h in range(6)]
#: Faults of the run, RANK:FIRST:LAST:KIND: a slow kernel launch on rank 3, a slow all-reduce on
#: rank 8, both after the 40-window warm-up.
FAULTS = ("3:60:64:latency", "8:75:79:bandwidth")
FAULTY = {("node1", "1003"), ("node4", "1008")}
#: Windows each simulated process sends: 40 of warm-up, the faults, and enough after them for a
#: replica restarted mid-run to warm up again (the replica-kill test).
WINDOWS = 130
LB = "load_balancing"


@dataclass
class Scored:
    """One scored window as the store received its score gauge."""

    score: float
    replica: str


@dataclass
class ScaleOut:
    """A running scale-out stack; ``replicas`` in the order of DETECTOR_REPLICAS."""

    store: Store
    gateway: Service
    replicas: list[Service]
    replica_ports: list[int]
    backends: Service
    gateway_grpc: int
    gateway_metrics: int
    backends_grpc: int
    log_dir: Path
    env: dict[str, str]
    sent: dict[str, int] = field(default_factory=lambda: {"spans": 0, "points": 0, "requests": 0})

    def start_replica(self, i: int, instance_id: str) -> Service:
        """Start replica i (again) on its port, named instance_id."""
        svc = Service(instance_id, [OTEL_EACGM, "detector", "serve", "--config", str(DETECTOR_CONFIG),
                                    "--listen", f"127.0.0.1:{self.replica_ports[i]}",
                                    "--export-endpoint", f"127.0.0.1:{self.backends_grpc}"],
                      dict(self.env, OTEL_EACGM_DETECTOR_INSTANCE_ID=instance_id), self.log_dir)
        svc.wait_port(self.replica_ports[i])
        self.replicas[i] = svc
        return svc

    def counter(self, metric: str) -> float:
        """The gateway's own counter of the loadbalancing exporter."""
        return collector_counter(self.gateway_metrics, metric, LB)

    def outcomes(self) -> dict[str, float]:
        """The gateway's otelcol_loadbalancer_backend_outcome, summed over replicas, by success."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.gateway_metrics}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        out = {"true": 0.0, "false": 0.0}
        for ok, v in re.findall(r'^otelcol_loadbalancer_backend_outcome{[^}]*success="(\w+)"[^}]*} (\S+)$', text, re.M):
            out[ok] += float(v)
        return out

    def run_agents(self, windows: int, pace_s: float, during: Callable[[], None] | None = None) -> float:
        """Run the simulated agents to the end (``during`` runs meanwhile); their wall time."""
        t0 = time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-m", "eacgm_testkit.sim_agent",
                                   "--endpoint", f"127.0.0.1:{self.gateway_grpc}",
                                   "--ranks", ",".join(map(str, ranks)), "--windows", str(windows),
                                   "--pace-s", str(pace_s), *(f"--fault={f}" for f in FAULTS)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
                 for ranks in HOSTS]
        if during:
            during()
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            for key, n in json.loads(out.splitlines()[-1]).items():
                self.sent[key] += n
        return time.monotonic() - t0

    def dropped(self) -> dict[str, int]:
        """Items the gateway dropped per signal once a replica's retries ran out, from its log:
        the replicas' exporters (one per replica, inside loadbalancing) log each drop, and count
        it in no metric of the gateway's."""
        out = {"traces": 0, "metrics": 0}
        for line in self.gateway.log.read_text(errors="replace").splitlines():
            if "Dropping data" in line and (m := re.search(r'"otelcol.signal": "(\w+)".*"dropped_items": (\d+)', line)):
                out[m[1]] += int(m[2])
        return out

    def flush(self, timeout_s: float = 120, quiet_s: float = 3.0) -> float:
        """Wait until the gateway took every span and point the agents sent and the store has
        received nothing new for quiet_s, then stop the replicas (each scores its open windows
        and flushes) and the backends collector. Returns when (time.monotonic()) the store last
        received something before the stop."""
        def taken() -> bool:
            return (self.counter("otelcol_exporter_sent_spans") >= self.sent["spans"]
                    and self.counter("otelcol_exporter_sent_metric_points") >= self.sent["points"])
        wait_until(taken, timeout_s, f"the gateway to take {self.sent['spans']} spans")
        seen = [-1, time.monotonic()]

        def quiet() -> bool:
            n = len(self.store.traces) + len(self.store.metrics)
            if n != seen[0]:
                seen[:] = [n, time.monotonic()]
            return time.monotonic() - seen[1] >= quiet_s
        wait_until(quiet, timeout_s, "the replicas' output to settle")
        for svc in self.replicas:
            assert svc.stop(60) == 0, svc.tail()
        assert self.backends.stop() == 0, self.backends.tail()
        return seen[1]

    def scored(self) -> dict[tuple[str, str, int], Scored]:
        """(host.name, process.pid, window start) -> its score and the replica that scored it."""
        out: dict[tuple[str, str, int], Scored] = {}
        for p in self.store.metric_points():
            if p["name"] != "eacgm.anomaly.score":
                continue
            res = p["resource"]
            key = (res["host.name"], str(res["process.pid"]), p["time"] - 10**9)
            assert key not in out, f"window {key} scored twice"
            out[key] = Scored(round(p["value"], 9), res["service.instance.id"])
        return out

    def anomalies(self) -> set[tuple[str, str, int]]:
        """(host.name, process.pid, window start) of every eacgm.anomaly record."""
        return {(r["attributes"]["host.name"], str(r["attributes"]["process.pid"]),
                 r["attributes"]["eacgm.anomaly.window.start"])
                for r in self.store.log_records() if r["event_name"] == "eacgm.anomaly"}


@contextlib.contextmanager
def scaleout(log_dir: Path, n_replicas: int, retry_max_elapsed: str = "300s") -> Iterator[ScaleOut]:
    """Start the stack with n_replicas; stop whatever still runs at the end."""
    server, store, store_port = serve()
    backends_grpc, gateway_grpc, gateway_metrics = free_port(), free_port(), free_port()
    replica_ports = [free_port() for _ in range(n_replicas)]
    env = dict(os.environ, EACGM_COLLECTOR_GRPC_PORT=str(backends_grpc), EACGM_COLLECTOR_HTTP_PORT=str(free_port()),
               EACGM_STORE_PORT=str(store_port), EACGM_GATEWAY_GRPC_PORT=str(gateway_grpc),
               EACGM_GATEWAY_METRICS_PORT=str(gateway_metrics), EACGM_RETRY_MAX_ELAPSED=retry_max_elapsed,
               OTLP_BACKEND=f"127.0.0.1:{backends_grpc}",
               DETECTOR_REPLICAS="[" + ", ".join(f"127.0.0.1:{p}" for p in replica_ports) + "]")
    started: list[Service] = []
    stack = None
    try:
        backends = Service("backends", [str(collector_binary()), "--config",
                                        str(REPO / "collector-config/test-pipeline.yaml")], env, log_dir)
        started.append(backends)
        backends.wait_port(backends_grpc)
        stack = ScaleOut(store, None, [None] * n_replicas, replica_ports, backends,  # type: ignore[arg-type]
                         gateway_grpc, gateway_metrics, backends_grpc, log_dir, env)
        for i in range(n_replicas):
            started.append(stack.start_replica(i, f"replica-{i}"))
        stack.gateway = Service("gateway", [str(collector_binary()), "--config",
                                            str(REPO / "collector-config/gateway-loadbalancing.yaml")], env, log_dir)
        started.append(stack.gateway)
        stack.gateway.wait_port(gateway_grpc)
        stack.gateway.wait_port(gateway_metrics)
        yield stack
    finally:
        for svc in [*(stack.replicas if stack else []), *reversed(started)]:
            if svc is not None:
                svc.stop()
        server.stop(0)
