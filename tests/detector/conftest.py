"""Shared fixtures: real OTLP gRPC receivers (the test kit's store) for the detector's output."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from eacgm_testkit.otlp_store import serve

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def receivers():
    """Factory of (Store, "127.0.0.1:port"), each a real gRPC server until the test ends."""
    servers = []

    def start():
        server, rec, port = serve()
        servers.append(server)
        return rec, f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(0).wait()


@pytest.fixture
def receiver(receivers):
    """(Store, "127.0.0.1:port") served by a real gRPC server for the test's duration."""
    return receivers()
