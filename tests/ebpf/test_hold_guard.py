"""An agent killed while the kernel holds a traced process's new child stopped for it (probes
scoped to processes) does not leave that child stopped for good: its hold guard continues it."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent_run import agent_cmd
from otel_eacgm.hold_guard import stopped

pytestmark = pytest.mark.ebpf

FORKER = """
import os, sys
print("ready", flush=True)
for _ in sys.stdin:  # one fork per line the test writes
    child = os.fork()
    if child == 0:
        os._exit(0)
    print(child, flush=True)
    os.waitpid(child, 0)
    print("reaped", flush=True)
"""


def lines_of(stream) -> queue.Queue:  # noqa: ANN001
    q: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [q.put(line.strip()) for line in stream], daemon=True).start()
    return q


def wait_for_text(path: Path, text: str, timeout_s: float) -> str:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if text in (log := path.read_text(errors="replace")):
            return log
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in the agent's log:\n{path.read_text(errors='replace')[-3000:]}")


def test_a_child_held_when_the_agent_is_killed_is_continued(tmp_path: Path) -> None:
    forker = subprocess.Popen([sys.executable, "-c", FORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    out = lines_of(forker.stdout)
    assert out.get(timeout=30) == "ready"
    log = tmp_path / "agent.log"
    with log.open("w") as err:
        agent = subprocess.Popen([*agent_cmd("http://127.0.0.1:9", "--pid", str(forker.pid))], stderr=err,
                                 env=dict(os.environ, OTEL_EACGM_GPU_METRICS="0", OTEL_EACGM_LOG_LEVEL="info"))
    try:
        wait_for_text(log, "ready:", 120)
        forker.stdin.write("\n")
        forker.stdin.flush()
        out.get(timeout=10)
        assert out.get(timeout=10) == "reaped"  # held and let go by the agent as it runs

        os.kill(agent.pid, signal.SIGSTOP)  # an agent that will never let go: stopped, then killed
        forker.stdin.write("\n")
        forker.stdin.flush()
        child = int(out.get(timeout=10))
        time.sleep(0.5)
        assert stopped(child), "the kernel did not hold the new child: nothing here tests the guard"
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(timeout=30)
        assert out.get(timeout=10) == "reaped"
        said = wait_for_text(log, "hold guard", 10)
        assert f"continued them: {child}" in said, said[-2000:]
    finally:
        for p in (agent, forker):
            if p.poll() is None:
                p.kill()
                p.wait()
