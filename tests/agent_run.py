"""Running `otel-eacgm agent` as its own process in tests, and reading its report."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
AGENT = [str(REPO / ".venv/bin/otel-eacgm"), "agent"]
WORKLOAD = str(REPO / "tests/workloads/cuda_nccl_calls.py")
PYTHON = sys.executable


_CTRL_C_ARMED = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"


def ctrl_c_armed(cmd: list[str]) -> list[str]:
    """`cmd` with SIGINT at its default, as at a terminal, for a test that sends it Ctrl-C. A suite
    started in the background (`.ci/run &`, nohup) ignores SIGINT, every child inherits that, and
    Python then installs no KeyboardInterrupt handler: the Ctrl-C would be lost."""
    return [sys.executable, "-c", _CTRL_C_ARMED, *cmd]


def agent_cmd(endpoint: str, *extra: str) -> list[str]:
    """The agent's command line for a test (insecure gRPC to the test collector by default)."""
    return [*AGENT, "--endpoint", endpoint, "--insecure", *extra]


def run_traced(endpoint: str, plan: list, *extra: str, env: dict | None = None, timeout: float = 120) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """`otel-eacgm agent ... -- python workload PLAN`; returns the run and the workload's call log."""
    cmd = agent_cmd(endpoint, *extra, "--", PYTHON, WORKLOAD, json.dumps(plan))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})))
    calls = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, calls


def summary(stderr: str) -> dict[str, int]:
    """The agent's final `done:` counters."""
    lines = [line for line in stderr.splitlines() if " done: " in line]
    if not lines:
        raise AssertionError(f"agent printed no summary; stderr:\n{stderr[-3000:]}")
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", lines[-1].split(" done: ", 1)[1])}


def exported_spans(store, pid: int, stderr: str, timeout_s: float = 30) -> list[dict]:  # noqa: ANN001
    """Process `pid`'s spans in `store` once as many arrived as the agent says it exported (its
    `done:` line in `stderr`)."""
    exported = summary(stderr)["exported"]

    def mine() -> list[dict]:
        return [s for s in store.spans() if s["attributes"].get("process.pid") == pid]

    assert store.wait_for(lambda: len(mine()) >= exported, timeout_s), (len(mine()), exported)
    return mine()


def children(spans: list[dict]) -> dict[str, list[dict]]:
    """span id -> child spans, in start order."""
    out: dict[str, list[dict]] = collections.defaultdict(list)
    for s in sorted(spans, key=lambda s: s["start"]):
        out[s["parent_span_id"]].append(s)
    return out


def wait_for_earlier_releases(timeout_s: float = 60) -> None:
    """An earlier test's agent may still be releasing its probes, and the guardrail cycles nothing
    before that ends: wait for it (at most `timeout_s`)."""
    from otel_eacgm.probe_links import releases_running  # noqa: PLC0415 - the eBPF tests' import

    deadline = time.monotonic() + timeout_s
    while releases_running() and time.monotonic() < deadline:
        time.sleep(0.5)
