"""An agent built and then stopped before it runs (Ctrl-C while it starts) gives back what start-up
took: the BPF program's and the links' file descriptors, the export and metric threads."""

from __future__ import annotations

import os
import threading

import pytest

from otel_eacgm.config import load
from otel_eacgm.wiring import build_agent

pytestmark = pytest.mark.ebpf


def test_a_discarded_agent_leaves_no_descriptor_and_no_export_thread() -> None:
    before = set(os.listdir("/proc/self/fd"))
    agent = build_agent(load(None, {"endpoint": "http://127.0.0.1:9", "insecure": True, "pids": [os.getpid()],
                                    "gpu_metrics": False}))
    assert len(set(os.listdir("/proc/self/fd")) - before) > 5  # the program's maps and the probe links
    agent.discard()
    assert not set(os.listdir("/proc/self/fd")) - before
    names = {t.name for t in threading.enumerate()}
    assert "otel-eacgm-export" not in names and "OtelPeriodicExportingMetricReader" not in names, names
