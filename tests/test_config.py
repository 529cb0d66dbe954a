"""Agent configuration: precedence, validation and error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_eacgm.config import ConfigError, load

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "agent.yaml"


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    f = tmp_path / "a.yaml"
    f.write_text("exporter:\n  endpoint: http://file:4317\n  batch_size: 100\ncapture:\n  launch_layer: cuda.runtime\n")
    cfg = load(str(f), {"endpoint": "http://flag:4317"}, environ={"OTEL_EACGM_ENDPOINT": "http://env:4317",
                                                                   "OTEL_EACGM_BATCH_SIZE": "200"})
    assert cfg.endpoint == "http://flag:4317" and cfg.batch_size == 200 and cfg.launch_layer == "cuda.runtime"


def test_example_config_loads() -> None:
    cfg = load(str(EXAMPLE), environ={})
    assert cfg.launch_layer == "cuda.driver"


@pytest.mark.parametrize("text, message", [
    ("capture:\n  layers: [cuda.runtime, opencl]\n", "layers ['opencl'] unknown"),
    ("capture:\n  ringbuf_pages: 1000\n", "ringbuf_pages 1000 must be a power of two"),
    ("exporter:\n  protocol: thrift\n", "protocol 'thrift' is not one of"),
    ("bogus: 1\n", "unknown setting 'bogus'"),
    ("capture:\n  launch_returns: maybe\n", "launch_returns='maybe' is invalid"),
    ("- a\n- b\n", "must hold a mapping"),
    ("a: [\n", "is not valid YAML"),
    ("pause_cycle_s: 0.05\n", "pause_cycle_s 0.05 must be 0"),
    ("pause_cycle_s: 1\npause_cycle_log: /nonexistent-eacgm/pauses.jsonl\n", "its directory does not exist"),
])
def test_bad_values_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load(str(f), environ={})


def test_missing_file_and_bad_env() -> None:
    with pytest.raises(ConfigError, match="config file /nonexistent.yaml: No such file"):
        load("/nonexistent.yaml", environ={})
    with pytest.raises(ConfigError, match="environment: queue_size='lots' is invalid"):
        load(None, environ={"OTEL_EACGM_QUEUE_SIZE": "lots"})


def test_example_config_names_every_option_at_its_default() -> None:
    import dataclasses  # noqa: PLC0415

    from otel_eacgm.config import AgentConfig  # noqa: PLC0415

    text = EXAMPLE.read_text()
    missing = [f.name for f in dataclasses.fields(AgentConfig) if f"{f.name}:" not in text]
    assert missing == [], f"examples/agent.yaml lacks {missing}"
    loaded, default = load(str(EXAMPLE), environ={}), AgentConfig()
    differ = {f.name for f in dataclasses.fields(AgentConfig) if getattr(loaded, f.name) != getattr(default, f.name)}
    assert differ == set(), f"examples/agent.yaml sets {differ} to other than the defaults"


def test_environment_and_yaml_rules(tmp_path: Path) -> None:
    # Text is parsed by the field's type; an empty variable counts as unset.
    cfg = load(None, environ={"OTEL_EACGM_LAYERS": "nccl, torch", "OTEL_EACGM_PIDS": "1,2",
                              "OTEL_EACGM_LAUNCH_RETURNS": "on", "OTEL_EACGM_ENDPOINT": ""})
    assert (cfg.layers, cfg.pids, cfg.launch_returns, cfg.endpoint) == (["nccl", "torch"], [1, 2], True, None)
    with pytest.raises(ConfigError, match=r"\(from OTEL_EACGM_TRACE_SLICE_S\)"):
        load(None, environ={"OTEL_EACGM_TRACE_SLICE_S": "nan"})
    f = tmp_path / "a.yaml"
    f.write_text("capture:\n  bogus: 1\n")
    with pytest.raises(ConfigError, match=r"unknown setting 'bogus' \(in section 'capture'\)"):
        load(str(f), environ={})
    f.write_text("batch_size: 100\nexporter:\n  batch_size: 200\n")
    with pytest.raises(ConfigError, match=r"'batch_size' is set twice \(batch_size and exporter.batch_size\)"):
        load(str(f), environ={})


def test_every_setting_is_documented_where_declared() -> None:
    import dataclasses  # noqa: PLC0415

    from otel_eacgm.config import AgentConfig  # noqa: PLC0415
    from otel_eacgm.environment_variables import agent_variables  # noqa: PLC0415
    from otel_eacgm.settings import field_docs  # noqa: PLC0415

    docs = field_docs(AgentConfig)
    assert [f.name for f in dataclasses.fields(AgentConfig) if not docs.get(f.name)] == []
    assert set(agent_variables()) == {f"OTEL_EACGM_{f.name.upper()}" for f in dataclasses.fields(AgentConfig)}
