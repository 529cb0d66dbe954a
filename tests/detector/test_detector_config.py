"""Config validation and the loadbalancing gateway example."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from eacgm_detector.config import DetectorConfig

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_valid_and_bind_localhost():
    cfg = DetectorConfig().validate()
    assert cfg.listen.startswith("127.0.0.1:")


@pytest.mark.parametrize("key,value,match", [
    ("window_s", 0, "window_s: 0 must be > 0"),
    ("covariance_type", "banana", "covariance_type: 'banana'"),
    ("threshold_risk", 1.5, "threshold_risk: 1.5"),
    ("listen", "localhost", "listen: 'localhost'"),
    ("tls_cert_file", "c.pem", "tls_cert_file / tls_key_file"),
    ("warmup_windows", 3, "warmup_windows: 3"),
])
def test_validate_names_the_key(key, value, match):
    with pytest.raises(ValueError, match=match):
        DetectorConfig(**{key: value}).validate()


def test_yaml_load_and_unknown_keys(tmp_path):
    good = tmp_path / "d.yaml"
    good.write_text("window_s: 5\ncovariance_type: diag\nentity_attributes: [host.name]\n")
    cfg = DetectorConfig.load(good)
    assert (cfg.window_s, cfg.covariance_type, cfg.entity_attributes) == (5, "diag", ["host.name"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("windw_s: 5\n")
    with pytest.raises(ValueError, match=r"unknown detector config key\(s\) \['windw_s'\]"):
        DetectorConfig.load(bad)


def test_loadbalancing_gateway_routes_by_entity():
    doc = yaml.safe_load((ROOT / "collector-config" / "gateway-loadbalancing.yaml").read_text())
    lb = doc["exporters"]["loadbalancing"]
    # Entities are resource attributes: routing by them keeps each entity on one replica
    # (the exporter's `resource` key does not serve spans).
    assert lb["routing_key"] == "attributes"
    assert set(lb["routing_attributes"]) <= set(DetectorConfig().entity_attributes)
    for pipeline in ("traces", "metrics"):
        assert "loadbalancing" in doc["service"]["pipelines"][pipeline]["exporters"]
    # Logs are not sent to the replicas in this layout.
    assert "loadbalancing" not in doc["service"]["pipelines"]["logs"]["exporters"]


def test_docs_example_config_loads():
    text = (ROOT / "docs" / "detector.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = DetectorConfig.from_mapping(yaml.safe_load(block))
    assert cfg.warmup_windows == 90 and cfg.listen == "0.0.0.0:4319"
