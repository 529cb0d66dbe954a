"""Config validation and the loadbalancing gateway example."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from eacgm_detector.config import BEARER_TOKEN_ENV, ConfigError, DetectorConfig
from otel_eacgm.settings import field_docs

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_valid_and_bind_localhost():
    cfg = DetectorConfig().validate()
    assert cfg.listen.startswith("127.0.0.1:")


def test_the_threshold_risk_is_the_alarm_budget_per_hour_unless_set():
    # 0.5 alarms an hour: one window in 7,200 of 2 s, one in 24 of 5 minutes.
    assert DetectorConfig(window_s=2).validate().risk == pytest.approx(0.5 * 2 / 3600)
    assert DetectorConfig(window_s=300).validate().risk == pytest.approx(0.5 * 300 / 3600)
    assert DetectorConfig(window_s=86400, alarms_per_hour=1).validate().risk == 0.5
    assert DetectorConfig(window_s=2, threshold_risk=1e-3).validate().risk == 1e-3
    assert DetectorConfig.load(flags={"alarms_per_hour": "2", "window_s": "36"}).risk == pytest.approx(0.02)


@pytest.mark.parametrize("key,value,match", [
    ("window_s", 0, "window_s: 0 must be > 0"),
    ("covariance_type", "banana", "covariance_type: 'banana'"),
    ("threshold_risk", 1.5, "threshold_risk: 1.5"),
    ("alarms_per_hour", 0.0, "alarms_per_hour: 0.0"),
    ("max_fit_windows", 0, "max_fit_windows: 0"),
    ("spike_floor", -0.5, "spike_floor: -0.5"),
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
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown setting 'windw_s'; did you mean 'window_s'\?"):
        DetectorConfig.load(bad)


def test_loadbalancing_gateway_routes_by_entity():
    doc = yaml.safe_load((ROOT / "collector-config" / "gateway-loadbalancing.yaml").read_text())
    lb = doc["exporters"]["load_balancing"]
    # Routing by the entity's attributes keeps each entity on one replica, spans and metrics alike.
    assert lb["routing_key"] == "attributes"
    assert lb["routing_attributes"] == DetectorConfig().entity_attributes
    for pipeline in ("traces", "metrics"):
        assert "load_balancing" in doc["service"]["pipelines"][pipeline]["exporters"]
    # Logs are not sent to the replicas in this layout.
    assert "load_balancing" not in doc["service"]["pipelines"]["logs"]["exporters"]


def test_docs_example_config_loads():
    text = (ROOT / "docs" / "detector.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = DetectorConfig.from_mapping(yaml.safe_load(block))
    assert cfg.warmup_windows == 90 and cfg.listen == "0.0.0.0:4319"
    assert cfg.check_listen() is False  # off loopback with TLS: `serve` takes it without insecure_listen


@pytest.mark.parametrize("listen,extra,exposed", [
    ("127.0.0.1:4319", {}, False), ("localhost:4319", {}, False), ("[::1]:4319", {}, False),
    ("0.0.0.0:4319", {"bearer_token": "t"}, False), ("0.0.0.0:4319", {"insecure_listen": True}, True),
    ("[::]:4319", {"insecure_listen": True}, True), ("node7:4319", {"insecure_listen": True}, True),
])
def test_check_listen(listen, extra, exposed):
    assert DetectorConfig(listen=listen, **extra).validate().check_listen() is exposed


@pytest.mark.parametrize("listen", ["0.0.0.0:4319", "[::]:4319", "10.0.0.7:4319", "node7:4319"])
def test_a_plaintext_unauthenticated_listen_off_loopback_names_the_way_out(listen):
    with pytest.raises(ConfigError, match=rf"listen: '{re.escape(listen)}' is not a loopback address .* "
                                          r"set insecure_listen: true \(--insecure-listen\)"):
        DetectorConfig(listen=listen).validate().check_listen()


def test_precedence_flag_over_env_over_file(tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text("window_s: 5\ngrace_s: 2\nwarmup_windows: 20\n")
    env = {"OTEL_EACGM_DETECTOR_WINDOW_S": "6", "OTEL_EACGM_DETECTOR_GRACE_S": "3",
           "OTEL_EACGM_DETECTOR_ENTITY_ATTRIBUTES": "host.name, eacgm.rank"}
    cfg = DetectorConfig.load(f, {"window_s": 7.0, "listen": None}, environ=env)
    assert (cfg.window_s, cfg.grace_s, cfg.warmup_windows) == (7.0, 3.0, 20)
    assert cfg.entity_attributes == ["host.name", "eacgm.rank"] and cfg.listen == "127.0.0.1:4319"


def test_environment_follows_the_shared_convention():
    # The token keeps its variable; an empty variable counts as unset (OTel's rule).
    assert DetectorConfig.load(environ={BEARER_TOKEN_ENV: "tok"}).bearer_token == "tok"
    assert DetectorConfig.load(environ={BEARER_TOKEN_ENV: ""}).bearer_token is None
    # A value that does not parse raises, naming the key, the value, the type and the variable.
    with pytest.raises(ConfigError, match=r"environment: warmup_windows='many' is invalid \(not an integer\); "
                                          r"expected an integer \(from OTEL_EACGM_DETECTOR_WARMUP_WINDOWS\)"):
        DetectorConfig.load(environ={"OTEL_EACGM_DETECTOR_WARMUP_WINDOWS": "many"})
    # Variables of the prefix that name no setting belong to someone else.
    assert DetectorConfig.load(environ={"OTEL_EACGM_DETECTOR_NOT_A_KEY": "1"}) == DetectorConfig()


def test_sections_and_text_values_as_in_the_agent(tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text("receiver:\n  listen: 0.0.0.0:4319\nmodel:\n  warmup_windows: '20'\n  export_insecure: 'off'\n")
    cfg = DetectorConfig.load(f, environ={})
    assert (cfg.listen, cfg.warmup_windows, cfg.export_insecure) == ("0.0.0.0:4319", 20, False)
    f.write_text("window_s: 5\nmodel:\n  window_s: 6\n")
    with pytest.raises(ConfigError, match="'window_s' is set twice"):
        DetectorConfig.load(f, environ={})


def test_a_bad_token_is_not_echoed():
    with pytest.raises(ConfigError, match="bearer_token=<hidden> is invalid") as exc:
        DetectorConfig.from_mapping({"bearer_token": ["s3cret"]})
    assert "s3cret" not in str(exc.value)


@pytest.mark.parametrize("token", ["s3cret ", " s3cret", "  s3cret  "])
def test_a_token_with_blanks_at_either_end_is_refused_without_echoing_it(token):
    """The interceptor strips what a client sends, so such a token could never authenticate."""
    with pytest.raises(ConfigError, match="bearer_token: has blanks at its start or end") as exc:
        DetectorConfig(bearer_token=token).validate()
    assert "s3cret" not in str(exc.value)


def test_every_setting_is_documented_where_declared():
    from dataclasses import fields  # noqa: PLC0415

    from otel_eacgm.environment_variables import detector_variables  # noqa: PLC0415

    docs = field_docs(DetectorConfig)
    assert [f.name for f in fields(DetectorConfig) if not docs.get(f.name)] == []
    assert set(detector_variables()) == {f"OTEL_EACGM_DETECTOR_{f.name.upper()}" for f in fields(DetectorConfig)}
    assert BEARER_TOKEN_ENV in detector_variables()
