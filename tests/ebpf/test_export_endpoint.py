"""A plaintext/TLS mismatch or a wrong port, against the real Collector: the agent names the
endpoint and the fix in one WARNING, and `doctor --endpoint` finds the same with a real export.

The classic case (issue 28): OTEL_EXPORTER_OTLP_ENDPOINT=127.0.0.1:4317, no scheme, means TLS
for gRPC under the OpenTelemetry specification, and the Collector listens in plaintext."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from agent_run import AGENT, PYTHON, REPO, WORKLOAD, summary
from loopback import free_port
from otel_eacgm.endpoint_check import Listener, probe

pytestmark = pytest.mark.ebpf

PLAN = [["cudaMalloc", 2], ["cudaDeviceSynchronize", 2]]
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {
    "OTEL_EACGM_EXPORT_TIMEOUT_S": "2", "OTEL_EACGM_GPU_METRICS": "0", "OTEL_EACGM_METRICS_INTERVAL_S": "60"}


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def traced_stderr(*flags: str) -> str:
    proc = subprocess.run([*AGENT, *flags, "--launch-layer", "cuda.runtime", "--", PYTHON, WORKLOAD, json.dumps(PLAN)],
                          capture_output=True, text=True, timeout=180, env=CLEAN_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def warnings_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "WARNING otel_eacgm.endpoint_check" in line]


def test_probe_tells_what_listens(pipeline) -> None:  # noqa: ANN001
    assert probe("127.0.0.1", port_of(pipeline.grpc_endpoint)) is Listener.H2C
    assert probe("127.0.0.1", port_of(pipeline.http_endpoint)) is Listener.HTTP1
    assert probe("127.0.0.1", free_port()) is Listener.NOTHING


def test_a_plain_host_port_grpc_endpoint_warns_once_with_the_fix(pipeline) -> None:  # noqa: ANN001
    where = f"127.0.0.1:{port_of(pipeline.grpc_endpoint)}"
    stderr = traced_stderr("--endpoint", where)
    assert summary(stderr)["export_failures"] >= 1 and summary(stderr)["exported"] == 0
    (line,) = warnings_of(stderr)
    assert f"export to {where} (grpc, TLS) failed" in line
    assert f"http://{where}" in line and "OTEL_EXPORTER_OTLP_INSECURE=true" in line


def test_http_on_the_grpc_port_names_the_http_port(pipeline) -> None:  # noqa: ANN001
    stderr = traced_stderr("--protocol", "http/protobuf", "--endpoint", pipeline.grpc_endpoint)
    (line,) = warnings_of(stderr)
    assert "is an OTLP/gRPC port" in line and "use port 4318" in line


def test_doctor_checks_the_endpoint_with_a_real_export(pipeline) -> None:  # noqa: ANN001
    doctor = [str(REPO / ".venv/bin/otel-eacgm"), "doctor", "--endpoint"]
    where = f"127.0.0.1:{port_of(pipeline.grpc_endpoint)}"
    bad = subprocess.run([*doctor, where], capture_output=True, text=True, timeout=120, env=CLEAN_ENV)
    (line,) = [x for x in bad.stdout.splitlines() if "] endpoint:" in x]
    assert line.startswith("[FAIL] endpoint: an OTLP export to") and f"http://{where}" in line, line
    assert bad.returncode == 1
    good = subprocess.run([*doctor, f"http://{where}"], capture_output=True, text=True, timeout=120, env=CLEAN_ENV)
    (line,) = [x for x in good.stdout.splitlines() if "] endpoint:" in x]
    assert line.startswith("[ok  ] endpoint:") and "accepted" in line, line
    http = subprocess.run([*doctor, pipeline.http_endpoint, "--protocol", "http/protobuf"], capture_output=True,
                          text=True, timeout=120, env=CLEAN_ENV)
    assert "[ok  ] endpoint:" in http.stdout, http.stdout
