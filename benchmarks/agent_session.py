"""Running `otel-eacgm agent` as a separate process from a benchmark: start, readiness, stop,
its `done:` counters, its CPU and memory, and the background release of its probes.

Readiness: with ``--pid`` the agent attaches to what the targets map before it logs ``ready:``,
so a block that starts after that line is traced from its first call. Release: at exit an
agent holding 8 or more probe links or perf events hands them to a forked child that closes them
in the background (one kernel synchronisation per link, about 0.1 s per perf-event probe; see
probe_links.ProbeLinks.release). Until that child is gone the probes stay
in every process mapping the libraries, so an "untraced" measurement must wait for it:
``Agent.stop`` returns the child's pid and ``wait_gone`` waits.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from proc_stat import peak_rss_mib, proc_stat

REPO = Path(__file__).resolve().parent.parent
ALL_LAYERS = "cuda.runtime,cuda.driver,nccl,torch,python"


def agent_base() -> list[str]:
    """The agent as installed in .venv, else from the source tree with this interpreter."""
    exe = REPO / ".venv/bin/otel-eacgm"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "otel_eacgm.cli"]


def cpu_rss(pid: int) -> tuple[float, float, float] | None:
    """(CPU seconds, RSS MiB, peak RSS MiB) of a live process (all its threads), None once gone."""
    s, peak = proc_stat(pid), peak_rss_mib(pid)
    return None if s is None or peak is None else (s.cpu_s, s.rss_mib, peak)


def wait_gone(pid: int | None, timeout_s: float) -> tuple[float, bool]:
    """Wait until ``pid`` (not our child) has exited; (seconds waited, whether it is gone)."""
    t0 = time.monotonic()
    if pid is None:
        return 0.0, True
    while os.path.exists(f"/proc/{pid}") and time.monotonic() - t0 < timeout_s:
        time.sleep(0.1)
    return time.monotonic() - t0, not os.path.exists(f"/proc/{pid}")


def agent_processes() -> list[int]:
    """Pids of running `otel-eacgm agent` processes (and their probe-releasing children, which
    keep the agent's command line), other than this process."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"agent" in argv and any(a.endswith((b"otel-eacgm", b"otel_eacgm.cli")) for a in argv):
            pids.append(int(entry.name))
    return pids


def parse_counters(line: str) -> dict[str, int]:
    """key=value integers of an agent `done:` / `stats:` line."""
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


class Agent:
    """One agent process with stderr to a log file; ``start`` returns once probes are attached."""

    def __init__(self, args: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None) -> None:
        self.args = list(args)
        self.log_path = log_path
        self.env = dict(os.environ, **(env or {}))
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_s = 0.0
        self.ready_line = ""

    def start(self, timeout_s: float = 300.0) -> Agent:
        """Launch and wait for the `ready:` log line (BCC compile + attach)."""
        t0 = time.monotonic()
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([*agent_base(), "agent", *self.args], stdout=self._log,
                                     stderr=subprocess.STDOUT, env=self.env)
        while time.monotonic() - t0 < timeout_s:
            text = self.log_path.read_text(errors="replace")
            ready = [ln for ln in text.splitlines() if " ready: " in ln]
            if ready:
                self.ready_s, self.ready_line = time.monotonic() - t0, ready[-1]
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode} before ready; log {self.log_path}:\n"
                                   f"{text[-3000:]}")
            time.sleep(0.1)
        self.proc.kill()
        raise RuntimeError(f"agent not ready after {timeout_s:.0f} s; log {self.log_path}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def usage(self) -> tuple[float, float, float] | None:
        """The agent's (CPU s, RSS MiB, peak RSS MiB) now."""
        return cpu_rss(self.pid)

    def stop(self, timeout_s: float = 120.0) -> dict:
        """SIGINT (flush and exit); the `done:` counters, exit code, stop time, release child pid."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._log.close()
        text = self.log_path.read_text(errors="replace")
        done = [ln for ln in text.splitlines() if " done: " in ln]
        release = re.findall(r"(\d+) probes are released by pid (\d+)", text)
        return {"exit": code, "stop_s": round(time.monotonic() - t0, 3),
                "done": parse_counters(done[-1].split(" done: ", 1)[1]) if done else {},
                "released_probes": int(release[-1][0]) if release else 0,
                "release_pid": int(release[-1][1]) if release else None,
                "guardrail": [ln.split("guardrail: ", 1)[1][:200] for ln in text.splitlines() if "guardrail: " in ln],
                "errors": [ln[-300:] for ln in text.splitlines() if " ERROR " in ln or "Traceback" in ln][:5]}


def med(xs: Sequence[float]) -> float | None:
    """Median, None for no data."""
    return statistics.median(xs) if xs else None


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table; floats with 4 significant digits, None as a dash."""
    def cell(v: object) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
