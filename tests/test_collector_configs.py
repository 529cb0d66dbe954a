"""Every config in collector-config/ is accepted by the real build that runs it: the project's
Collector (v0.161.0, with contrib's loadbalancing and zipkin exporters) or, for
jaeger-local.yaml, the cached Jaeger."""

from __future__ import annotations

import os
import subprocess

import pytest

from collector_build import REPO, collector_binary, jaeger_binary

PORT_VARS = ("EACGM_COLLECTOR_GRPC_PORT", "EACGM_COLLECTOR_HTTP_PORT", "EACGM_STORE_PORT", "EACGM_JAEGER_OTLP_PORT",
             "EACGM_DETECTOR_PORT", "EACGM_DETECTED_PORT", "EACGM_COLLECTOR_METRICS_PORT", "EACGM_GATEWAY_GRPC_PORT",
             "EACGM_GATEWAY_METRICS_PORT", "EACGM_ZIPKIN_PORT", "EACGM_VICTORIALOGS_PORT", "EACGM_JAEGER_UI_PORT",
             "EACGM_JAEGER_QUERY_GRPC_PORT")
# Endpoints of the deployment configs (tempo.yaml's Tempo is not run here)
HOST_VARS = ("TEMPO_ENDPOINT", "DETECTOR_ENDPOINT", "OTLP_BACKEND")
CONFIGS = sorted(p.name for p in (REPO / "collector-config").glob("*.yaml"))


def test_every_config_is_checked() -> None:
    assert {"gateway-loadbalancing.yaml", "detector-pipeline.yaml", "demo.yaml", "tempo.yaml",
            "test-pipeline.yaml", "jaeger-local.yaml"} <= set(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_validates(name: str) -> None:
    env = dict(os.environ, **{var: str(4317 + i) for i, var in enumerate(PORT_VARS)},
               **{var: f"{var.lower()}:4317" for var in HOST_VARS},
               DETECTOR_REPLICAS="[detector-0:4319, detector-1:4319, detector-2:4319]", EACGM_RETRY_MAX_ELAPSED="300s")
    binary = jaeger_binary() if name == "jaeger-local.yaml" else collector_binary()
    proc = subprocess.run([str(binary), "validate", "--config", str(REPO / "collector-config" / name)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_a_broken_config_is_refused(tmp_path) -> None:  # noqa: ANN001
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "collector-config/demo.yaml").read_text().replace("otlp_grpc/store]", "otlp_grpc/nowhere]"))
    env = dict(os.environ, **{var: "4317" for var in PORT_VARS})
    proc = subprocess.run([str(collector_binary()), "validate", "--config", str(bad)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "otlp_grpc/nowhere" in proc.stderr


@pytest.mark.parametrize("name", [c for c in CONFIGS if c != "jaeger-local.yaml"])
def test_config_starts_without_deprecated_names(name: str) -> None:
    """`validate` accepts the deprecated component aliases (`otlp`/`otlphttp` exporters) silently;
    only a running Collector warns, so each config is started for a few seconds."""
    env = dict(os.environ, **{var: str(24317 + i) for i, var in enumerate(PORT_VARS)},
               **{var: "127.0.0.1:9" for var in HOST_VARS},
               DETECTOR_REPLICAS="[127.0.0.1:9]", EACGM_RETRY_MAX_ELAPSED="1s")
    proc = subprocess.run(["timeout", "-s", "INT", "4", str(collector_binary()), "--config",
                           str(REPO / "collector-config" / name)], env=env, capture_output=True, text=True, timeout=60)
    assert "Everything is ready" in proc.stderr, proc.stderr[-2000:]
    assert "deprecated" not in proc.stderr.lower(), [l for l in proc.stderr.splitlines() if "eprecat" in l]


def test_the_readme_collector_config_starts_without_deprecated_names(tmp_path) -> None:  # noqa: ANN001
    """README's "Pointing a collector at the agent" snippet is a whole config a user can start."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### Pointing a collector at the agent"):]
    snippet = section[section.index("```yaml\n") + 8:section.index("```\n", section.index("```yaml\n") + 8)]
    config = tmp_path / "readme.yaml"
    config.write_text(snippet.replace("0.0.0.0:4317", "127.0.0.1:24397").replace("0.0.0.0:4318", "127.0.0.1:24398"))
    proc = subprocess.run(["timeout", "-s", "INT", "4", str(collector_binary()), "--config", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert "Everything is ready" in proc.stderr, proc.stderr[-2000:]
    assert "deprecated" not in proc.stderr.lower(), [l for l in proc.stderr.splitlines() if "eprecat" in l]
