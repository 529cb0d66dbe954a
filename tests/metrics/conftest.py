"""Fixtures for the host-metrics tests."""

from __future__ import annotations

import os
import shutil

import pytest
from metrics_ebpf_env import skip_or_fail


@pytest.fixture
def ebpf_ready() -> None:
    """Skip (with the reason) unless running as root with the `ip` tool for network namespaces."""
    if os.geteuid() != 0:
        skip_or_fail("needs root to load BPF and create network namespaces")
    if shutil.which("ip") is None:
        skip_or_fail("needs iproute2's `ip` to create a network namespace")
