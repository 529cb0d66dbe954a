"""Skip-or-fail for tests that need root, BPF and network namespaces."""

from __future__ import annotations

import os

import pytest


def skip_or_fail(reason: str) -> None:
    """Skip, or fail where OTEL_EACGM_REQUIRE_EBPF=1 says the environment must support eBPF."""
    if os.environ.get("OTEL_EACGM_REQUIRE_EBPF") == "1":
        pytest.fail(f"eBPF required (OTEL_EACGM_REQUIRE_EBPF=1) but: {reason}")
    pytest.skip(reason)
