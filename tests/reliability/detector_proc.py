"""`otel-eacgm detector serve` as its own process: killed, restarted, fuzzed from outside.

In-process DetectorService tests cannot see a crash (it would take pytest down with it) or a
restart from disk; these tests need the real command.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import yaml

from loopback import free_port, wait_port

REPO = Path(__file__).resolve().parents[2]
DETECTOR = [str(REPO / ".venv/bin/otel-eacgm"), "detector", "serve"]


class DetectorProcess:
    """A detector on a fixed loopback port with the given config keys (written to a YAML file)."""

    def __init__(self, work_dir: Path, *, env: dict[str, str] | None = None, **config: object) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.config_path = work_dir / f"detector-{self.port}.yaml"
        self.config_path.write_text(yaml.safe_dump({"listen": self.address, **config}))
        self.log_path = work_dir / f"detector-{self.port}.log"
        self._env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *args: str) -> "DetectorProcess":
        """Start (again, same port and config); returns once the port accepts connections."""
        with open(self.log_path, "ab") as fh:
            self.proc = subprocess.Popen([*DETECTOR, "--config", str(self.config_path), *args], env=self._env,
                                         stdout=fh, stderr=subprocess.STDOUT)
        try:
            wait_port(self.port, 60)
        except TimeoutError:
            raise AssertionError(f"detector did not listen (exit {self.proc.poll()}):\n{self.log()[-3000:]}") from None
        return self

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Stop it (SIGTERM drains and flushes; SIGKILL is a crash); returns its status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(60)
        self.proc = None
        return code

    def alive(self) -> bool:
        """Whether the process is running."""
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        """Everything it printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
