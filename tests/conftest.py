"""Shared fixtures: the real OpenTelemetry Collector, the OTLP store behind it, the eBPF gate."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from collector_build import collector_binary  # noqa: E402
from loopback import free_port, wait_port  # noqa: E402
from eacgm_testkit.otlp_store import Store, serve  # noqa: E402

REQUIRE_EBPF = os.environ.get("OTEL_EACGM_REQUIRE_EBPF") == "1"


def pytest_configure(config: pytest.Config) -> None:  # noqa: ARG001
    """Agents started by tests export every span (the default samples), unless a test says otherwise.
    Python frame spans are off unless a test turns them on (tests/ebpf/test_python_frames.py):
    the other tests assert call trees as the call layers alone make them."""
    os.environ.setdefault("OTEL_EACGM_SPAN_SAMPLE_RATIO", "1")
    os.environ.setdefault("OTEL_EACGM_PYTHON_FRAMES", "0")


def _ebpf_problem() -> str | None:
    """Why eBPF tests cannot run here, or None."""
    from otel_eacgm.doctor import check_bcc, check_headers, check_privileges, check_tracefs, check_uprobe

    for check in (check_privileges, check_tracefs, check_headers, check_bcc, check_uprobe):
        result = check()
        if not result.ok:
            return f"{result.name}: {result.detail}"
    return None


_EBPF_PROBLEM: list[str | None] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip eBPF tests without eBPF, or fail them when CI requires eBPF."""
    if item.get_closest_marker("ebpf") is None:
        return
    if not _EBPF_PROBLEM:
        _EBPF_PROBLEM.append(_ebpf_problem())
    problem = _EBPF_PROBLEM[0]
    if problem:
        if REQUIRE_EBPF:
            pytest.fail(f"eBPF is required here (OTEL_EACGM_REQUIRE_EBPF=1) but unavailable: {problem}")
        pytest.skip(f"eBPF unavailable: {problem}")


class Pipeline:
    """A running collector and the store it exports to."""

    def __init__(self, store: Store, grpc_port: int, http_port: int) -> None:
        self.store = store
        self.grpc_endpoint = f"http://127.0.0.1:{grpc_port}"
        self.http_endpoint = f"http://127.0.0.1:{http_port}"


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """Real upstream Collector (OTLP gRPC + HTTP in) -> OTLP store, for the whole session."""
    server, store, store_port = serve()
    grpc_port, http_port = free_port(), free_port()
    env = dict(os.environ, EACGM_COLLECTOR_GRPC_PORT=str(grpc_port), EACGM_COLLECTOR_HTTP_PORT=str(http_port),
               EACGM_STORE_PORT=str(store_port))
    log = tmp_path_factory.mktemp("collector") / "collector.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([str(collector_binary()), "--config", str(REPO / "collector-config/test-pipeline.yaml")],
                                env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        wait_port(grpc_port)
        wait_port(http_port)
        yield Pipeline(store, grpc_port, http_port)
    finally:
        proc.terminate()
        proc.wait(10)
        server.stop(0)


@pytest.fixture(scope="session")
def standin_libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/fixtures/standin_libcuda.c built as libcuda.so.1 (no NVIDIA driver here)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stand-in libcuda")
    out = tmp_path_factory.mktemp("libcuda") / "libcuda.so.1"
    subprocess.run(["gcc", "-O0", "-shared", "-fPIC", "-o", str(out), str(REPO / "tests/fixtures/standin_libcuda.c")],
                   check=True)
    return out
