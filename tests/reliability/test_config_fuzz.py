"""Fuzzing the config loaders (agent: otel_eacgm/config.py, detector: detector/eacgm_detector/config.py).

Any YAML document, environment value or mapping must give either a valid configuration (every
number finite, every field of its declared type) or the loader's own error (ConfigError /
ValueError) naming the offending key: never a TypeError or a traceback, never a NaN that the
agent or detector trips over later.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eacgm_detector.config import DetectorConfig
from otel_eacgm.config import AgentConfig, ConfigError, load

REPO = Path(__file__).resolve().parents[2]
AGENT_KEYS = [f.name for f in dataclasses.fields(AgentConfig)]
DETECTOR_KEYS = [f.name for f in dataclasses.fields(DetectorConfig)]
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
                    st.sampled_from(["grpc", "cuda.driver", "1", "0", "on", "-1", "1e400", "nan", ".inf", "a,b"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)


def _finite_and_typed(cfg: object) -> None:
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        v = getattr(cfg, f.name)
        if isinstance(v, float):
            assert math.isfinite(v), f"{f.name}={v!r} accepted"
        if str(f.type).startswith("int"):
            assert isinstance(v, int) and not isinstance(v, bool), f"{f.name}={v!r} accepted as int"


def _names_a_key(message: str, keys) -> bool:  # noqa: ANN001 - iterable of str
    return any(str(k) in message or repr(k) in message for k in keys)


def _flat_keys(data: object) -> list[str]:
    if not isinstance(data, dict):
        return []
    out = []
    for k, v in data.items():
        out.append(str(k))
        out.extend(_flat_keys(v))
    return out


@FUZZ
@given(st.dictionaries(st.one_of(st.sampled_from(AGENT_KEYS), st.text(max_size=10)), values, max_size=5),
       st.sampled_from([None, "exporter", "capture"]))
def test_agent_config_file(tmp_path_factory, data, section) -> None:  # noqa: ANN001
    path = tmp_path_factory.mktemp("agent") / "agent.yaml"
    path.write_text(yaml.safe_dump({section: data} if section else data))
    try:
        cfg = load(str(path), environ={})
    except ConfigError as exc:
        assert _names_a_key(str(exc), _flat_keys(data) + ["otlp", "config file"]), str(exc)
        return
    _finite_and_typed(cfg)


@FUZZ
@given(st.dictionaries(st.sampled_from(AGENT_KEYS), st.text(max_size=20), min_size=1, max_size=4))
def test_agent_config_environment(env) -> None:  # noqa: ANN001
    environ = {f"OTEL_EACGM_{k.upper()}": v for k, v in env.items() if "\0" not in v}
    try:
        cfg = load(None, environ=environ)
    except ConfigError as exc:
        assert _names_a_key(str(exc), list(env) + ["otlp"]), str(exc)
        return
    _finite_and_typed(cfg)


@FUZZ
@given(st.text(max_size=200))
def test_agent_config_arbitrary_text(tmp_path_factory, text) -> None:  # noqa: ANN001
    path = tmp_path_factory.mktemp("agent") / "agent.yaml"
    path.write_text(text)
    try:
        load(str(path), environ={})
    except ConfigError as exc:
        assert str(path) in str(exc) or "setting" in str(exc) or "=" in str(exc), str(exc)


@FUZZ
@given(st.dictionaries(st.one_of(st.sampled_from(DETECTOR_KEYS), st.text(max_size=10), st.integers()), values,
                       max_size=5))
def test_detector_config_mapping(data) -> None:  # noqa: ANN001
    try:
        cfg = DetectorConfig.from_mapping(data)
    except ValueError as exc:
        assert _names_a_key(str(exc), [str(k) for k in data]), str(exc)
        return
    _finite_and_typed(cfg)


@FUZZ
@given(st.dictionaries(st.sampled_from(DETECTOR_KEYS), st.text(max_size=20), min_size=1, max_size=4))
def test_detector_config_environment(env) -> None:  # noqa: ANN001
    environ = {f"OTEL_EACGM_DETECTOR_{k.upper()}": v for k, v in env.items() if "\0" not in v}
    try:
        cfg = DetectorConfig.load(None, environ=environ)
    except ValueError as exc:
        assert _names_a_key(str(exc), list(env)), str(exc)
        return
    _finite_and_typed(cfg)


@FUZZ
@given(st.text(max_size=200))
def test_detector_config_arbitrary_text(tmp_path_factory, text) -> None:  # noqa: ANN001
    path = tmp_path_factory.mktemp("detector") / "d.yaml"
    path.write_text(text)
    try:
        DetectorConfig.load(path)
    except ValueError as exc:
        assert str(path) in str(exc) or "key" in str(exc) or ":" in str(exc), str(exc)


@pytest.mark.parametrize("text,named", [
    ("window_s: fast\n", "window_s"),
    ("grace_s: .inf\n", "grace_s"),
    ("listen: 4319\n", "listen"),
    ("entity_attributes: {host: name}\n", "entity_attributes"),
    ("window_s: [\n", "not valid YAML"),
    ("7: 1\n", "unknown setting 7"),
])
def test_detector_cli_refuses_a_bad_config_with_the_key_named(tmp_path: Path, text: str, named: str) -> None:
    bad = tmp_path / "d.yaml"
    bad.write_text(text)
    proc = subprocess.run([str(REPO / ".venv/bin/otel-eacgm"), "detector", "serve", "--config", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert named in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
