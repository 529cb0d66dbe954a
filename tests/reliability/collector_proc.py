"""The real OpenTelemetry Collector as a process the fault tests can stop and start again.

The session-wide collector of tests/conftest.py must stay up for every other test; an outage
test needs its own, on fixed ports, so that the agent's exporter finds it again at the same
address after a restart.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from collector_build import collector_binary
from loopback import free_port, wait_port

REPO = Path(__file__).resolve().parents[2]
TEST_PIPELINE = REPO / "collector-config/test-pipeline.yaml"


class CollectorProcess:
    """collector-config/test-pipeline.yaml (OTLP in on loopback, out to `sink_port`), or `config`."""

    def __init__(self, sink_port: int, log_path: Path, *, config: Path = TEST_PIPELINE,
                 env: dict[str, str] | None = None) -> None:
        self.grpc_port, self.http_port = free_port(), free_port()
        self.grpc_endpoint = f"http://127.0.0.1:{self.grpc_port}"
        self._cmd = [str(collector_binary()), "--config", str(config)]
        self._env = dict(os.environ, EACGM_COLLECTOR_GRPC_PORT=str(self.grpc_port),
                         EACGM_COLLECTOR_HTTP_PORT=str(self.http_port), EACGM_STORE_PORT=str(sink_port),
                         **(env or {}))
        self._log = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "CollectorProcess":
        """Start (again) on the same ports; returns once the OTLP gRPC port accepts connections."""
        with open(self._log, "ab") as fh:
            self.proc = subprocess.Popen(self._cmd, env=self._env, stdout=fh, stderr=subprocess.STDOUT)
        wait_port(self.grpc_port)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Stop it (SIGTERM: graceful, the batch is flushed; SIGKILL: a crash); returns its status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(30)
        self.proc = None
        return code

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        """Everything it printed so far."""
        return self._log.read_text(errors="replace") if self._log.exists() else ""
