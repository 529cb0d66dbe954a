"""Library discovery after start, targets given by pid, and a collector that is down."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent_run import PYTHON, WORKLOAD, agent_cmd, run_traced, summary
from loopback import free_port

pytestmark = pytest.mark.ebpf


def _stream_lines(pipe, sink: list[str]) -> threading.Thread:  # noqa: ANN001
    def pump() -> None:
        for line in pipe:
            sink.append(line)
    t = threading.Thread(target=pump, daemon=True)
    t.start()
    return t


def test_library_loaded_after_the_agent_started_is_traced_within_a_second(pipeline, tmp_path: Path) -> None:  # noqa: ANN001
    """--pid mode, no gating: the workload loads libcudart and libnccl after the agent is ready."""
    gate, load = tmp_path / "go", tmp_path / "load"
    plan = json.dumps([["cudaDeviceSynchronize", 5], ["ncclGroupStart", 2]])
    workload = subprocess.Popen([PYTHON, WORKLOAD, plan], stdout=subprocess.PIPE, text=True,
                                env=dict(os.environ, EACGM_LOAD_FILE=str(load), EACGM_WAIT_FILE=str(gate)))
    agent = subprocess.Popen(agent_cmd(pipeline.grpc_endpoint, "--pid", str(workload.pid), "--launch-layer", "cuda.runtime"),
                             stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    _stream_lines(agent.stderr, log)
    try:
        deadline = time.monotonic() + 60
        while not any(" ready: " in line for line in log):
            assert time.monotonic() < deadline and agent.poll() is None, "".join(log)[-3000:]
            time.sleep(0.05)
        assert "0 probes on 0 files" in next(line for line in log if " ready: " in line)
        time.sleep(0.5)
        load.touch()
        # The library appears in the workload's maps; the agent must attach within a second.
        maps = Path(f"/proc/{workload.pid}/maps")
        while "libcudart" not in maps.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.005)
        mapped_at = time.monotonic()
        while not any("attached" in line and "libnccl" in line for line in log):
            assert time.monotonic() - mapped_at < 1.0, "libraries not attached within 1 s of being mapped:\n" + "".join(log)[-3000:]
            time.sleep(0.01)
        gate.touch()
        out, _ = workload.communicate(timeout=30)
        pid = workload.pid
        assert pipeline.store.wait_for(
            lambda: len([s for s in pipeline.store.spans() if s["attributes"].get("process.pid") == pid]) == 7, 30), \
            "".join(log)[-3000:]
        # the traced process is gone; the agent keeps running until stopped
        assert agent.poll() is None
    finally:
        agent.terminate()
        agent.wait(60)
    assert agent.returncode == 0
    assert summary("".join(log))["calls"] == 7


def test_collector_down_drops_are_counted_and_nothing_crashes(tmp_path: Path) -> None:
    """Export to a port nobody listens on: the run completes, every call is counted as dropped."""
    dead = f"http://127.0.0.1:{free_port()}"
    env = {"OTEL_EACGM_QUEUE_SIZE": "1024", "OTEL_EACGM_BATCH_SIZE": "256", "OTEL_EACGM_EXPORT_TIMEOUT_S": "1"}
    proc, calls = run_traced(dead, [["cudaDeviceSynchronize", 3000]], "--launch-layer", "cuda.runtime", env=env,
                             timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(calls) == 3000
    c = summary(proc.stderr)
    assert c["calls"] == 3000
    assert c["exported"] == 0
    assert c["dropped_export"] == 3000  # queue overflow + failed exports: all accounted for
    assert c["export_failures"] >= 1
    assert "Traceback" not in proc.stderr


def test_bad_config_is_refused_with_the_key_named(tmp_path: Path) -> None:
    bad = tmp_path / "agent.yaml"
    bad.write_text("capture:\n  launch_layer: gpu\n")
    proc = subprocess.run(agent_cmd("http://127.0.0.1:1", "--config", str(bad)), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert re.search(r"launch_layer 'gpu' must be cuda.runtime or cuda.driver", proc.stderr)
