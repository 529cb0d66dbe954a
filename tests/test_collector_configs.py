"""Every collector config the project runs is accepted by the real Collector build."""

from __future__ import annotations

import os
import subprocess

import pytest

from collector_build import REPO, collector_binary

PORT_VARS = ("EACGM_COLLECTOR_GRPC_PORT", "EACGM_COLLECTOR_HTTP_PORT", "EACGM_STORE_PORT", "EACGM_JAEGER_OTLP_PORT",
             "EACGM_DETECTOR_PORT", "EACGM_DETECTED_PORT", "EACGM_COLLECTOR_METRICS_PORT")
# tempo.yaml's endpoints (Tempo itself is not run here)
HOST_VARS = ("TEMPO_ENDPOINT", "DETECTOR_ENDPOINT", "OTLP_BACKEND")


@pytest.mark.parametrize("name", ["test-pipeline.yaml", "demo.yaml", "detector-pipeline.yaml", "tempo.yaml"])
def test_config_validates(name: str) -> None:
    env = dict(os.environ, **{var: str(4317 + i) for i, var in enumerate(PORT_VARS)},
               **{var: f"{var.lower()}:4317" for var in HOST_VARS})
    proc = subprocess.run([str(collector_binary()), "validate", "--config", str(REPO / "collector-config" / name)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_a_broken_config_is_refused(tmp_path) -> None:  # noqa: ANN001
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "collector-config/demo.yaml").read_text().replace("otlp/store]", "otlp/nowhere]"))
    env = dict(os.environ, **{var: "4317" for var in PORT_VARS})
    proc = subprocess.run([str(collector_binary()), "validate", "--config", str(bad)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "otlp/nowhere" in proc.stderr
