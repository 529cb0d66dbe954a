"""`make demo` as a user runs it in a terminal: the real Collector, Jaeger and agent on
examples/cuda_steps.py with its communication fault; the demo names the anomaly the detector
found in the fault, prints a Jaeger address that answers, and keeps it up until Ctrl-C."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from agent_run import ctrl_c_armed  # noqa: E402
from loopback import free_port  # noqa: E402

pytestmark = pytest.mark.ebpf


def test_the_demo_names_the_anomaly_and_keeps_jaeger_up_in_a_terminal() -> None:
    ui_port = free_port()
    terminal, stdin = pty.openpty()  # stdin is a terminal, as in `make demo` at a shell
    # every port free: a Zipkin or VictoriaLogs already on its default port must not answer for this one
    demo = subprocess.Popen(ctrl_c_armed([sys.executable, str(REPO / "examples/demo.py"), "--workload", "cuda-steps",
                                          "--ui-port", str(ui_port), "--zipkin-port", str(free_port()),
                                          "--victorialogs-port", str(free_port())]),
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")})
    os.close(stdin)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 300
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line.rstrip())
            if "keep running until Ctrl-C" in line or time.monotonic() > deadline:
                break
        out = "\n".join(lines)
        assert "keep running until Ctrl-C" in out, out[-4000:]
        anomalies = [x for x in lines if x.strip().startswith("ANOMALY at")]
        assert any("<- the injected fault" in x and "ncclAllReduce" in x for x in anomalies), out[-4000:]
        assert "injected fault: communication slowdown, steps 201-250: found by the detector" in out
        (address,) = re.findall(r"^Jaeger: (http://\S+)", out, re.MULTILINE)
        with urllib.request.urlopen(address, timeout=10) as resp:  # it answers while the demo waits
            assert json.load(resp)["data"], "Jaeger holds no trace of the demo"
        time.sleep(1.0)
        assert demo.poll() is None  # still up: it waits for Ctrl-C
        demo.send_signal(signal.SIGINT)
        assert demo.wait(60) == 0
    finally:
        if demo.poll() is None:  # failed: Ctrl-C first, so that it stops its backends, as a user's would
            demo.send_signal(signal.SIGINT)
            try:
                demo.wait(30)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait()
        os.close(terminal)
