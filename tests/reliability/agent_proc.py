"""`otel-eacgm agent` as a long-running process: its log, its counters and its memory over time.

tests/agent_run.py runs an agent to completion; the reliability tests need to watch one while it
runs (stats lines, RSS every half second), stop it with a chosen signal and read the outcome.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Sequence

from agent_run import agent_cmd

_COUNTERS = re.compile(r"(\w+)=(\d+)")


def rss_kib(pid: int) -> int | None:
    """VmRSS of `pid` in KiB, None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class AgentProcess:
    """An agent exporting to `endpoint`; `env` adds OTEL_EACGM_* settings."""

    def __init__(self, endpoint: str, *args: str, env: dict[str, str] | None = None,
                 command: Sequence[str] = (), rss_interval_s: float = 0.5) -> None:
        cmd = agent_cmd(endpoint, *args, *(["--", *command] if command else []))
        full_env = {**os.environ, "OTEL_EACGM_STATS_LOG_INTERVAL_S": "1", **(env or {})}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self.stdout: list[str] = []
        self.rss: list[tuple[float, int]] = []  # (monotonic time, KiB)
        self._threads = [threading.Thread(target=self._pump, args=(self.proc.stderr, self.lines), daemon=True),
                         threading.Thread(target=self._pump, args=(self.proc.stdout, self.stdout), daemon=True),
                         threading.Thread(target=self._sample, args=(rss_interval_s,), daemon=True)]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(pipe, sink: list[str]) -> None:  # noqa: ANN001 - a text pipe
        for line in pipe:
            sink.append(line)

    def _sample(self, interval_s: float) -> None:
        while self.proc.poll() is None:
            kib = rss_kib(self.pid)
            if kib is not None:
                self.rss.append((time.monotonic(), kib))
            time.sleep(interval_s)

    def log(self) -> str:
        """The agent's stderr so far."""
        return "".join(self.lines)

    def wait_line(self, needle: str, timeout_s: float = 90.0) -> str:
        """Wait until a log line containing `needle` appears; returns it."""
        deadline = time.monotonic() + timeout_s
        while True:
            for line in list(self.lines):
                if needle in line:
                    return line
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"agent printed no {needle!r} (exit {self.proc.poll()}):\n{self.log()[-4000:]}")
            time.sleep(0.05)

    def stats(self) -> dict[str, int]:
        """Counters of the latest `stats:` (or `done:`) line; empty before the first one."""
        for line in reversed(list(self.lines)):
            for tag in (" done: ", " stats: "):
                if tag in line:
                    return {k: int(v) for k, v in _COUNTERS.findall(line.split(tag, 1)[1])}
        return {}

    def wait_stats(self, predicate, timeout_s: float) -> dict[str, int]:  # noqa: ANN001 - dict -> bool
        """Wait until the latest stats line satisfies `predicate`; returns it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            s = self.stats()
            if s and predicate(s):
                return s
            assert self.proc.poll() is None, f"agent exited {self.proc.returncode}:\n{self.log()[-4000:]}"
            time.sleep(0.2)
        raise AssertionError(f"stats never satisfied the condition; last {self.stats()}\n{self.log()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 120.0) -> int:
        """Send `sig` and wait for the exit status; the log is complete afterwards."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout_s)
        for t in self._threads[:2]:
            t.join(10)
        return code

    def stop_when_exited(self, timeout_s: float) -> int:
        """Wait for an agent running `-- COMMAND` to exit by itself; its status."""
        code = self.proc.wait(timeout_s)
        for t in self._threads[:2]:
            t.join(10)
        return code

    def done(self) -> dict[str, int]:
        """The final `done:` counters."""
        lines = [line for line in self.lines if " done: " in line]
        assert lines, f"agent printed no done line:\n{self.log()[-4000:]}"
        return {k: int(v) for k, v in _COUNTERS.findall(lines[-1].split(" done: ", 1)[1])}

    def rss_growth_kib(self, since: float) -> tuple[int, int, int]:
        """RSS samples taken after monotonic time `since`: (first, peak, last third's peak - first third's)."""
        late = [kib for t, kib in self.rss if t >= since]
        if len(late) < 6:
            raise AssertionError(f"too few RSS samples after {since}: {self.rss[-10:]}")
        third = len(late) // 3
        return late[0], max(late), max(late[-third:]) - max(late[:third])
