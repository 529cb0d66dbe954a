"""The environment variables the agent and the detector read, as documented data.

Every setting has a variable: ``OTEL_EACGM_<KEY>`` for the agent
(otel_eacgm.config.AgentConfig) and ``OTEL_EACGM_DETECTOR_<KEY>`` for the detector
(eacgm_detector.config.DetectorConfig), KEY being the setting's name in upper case, e.g.
OTEL_EACGM_QUEUE_SIZE=131072 or OTEL_EACGM_DETECTOR_WINDOW_S=5. Its meaning is the docstring
under the setting's field, written once there: `agent_variables()` and `detector_variables()`
list every variable with it, and ``python -m otel_eacgm.environment_variables`` prints them.
How they are read (precedence, empty values, parse errors) is otel_eacgm.settings' docstring.

The constants below are the prefixes, the variable whose use is advised over its setting, and
the standard OpenTelemetry variables whose standard meaning the project keeps.
"""

from __future__ import annotations

OTEL_EACGM_PREFIX = "OTEL_EACGM_"
"""Prefix of the agent's settings: ``OTEL_EACGM_<KEY>`` sets the agent setting ``<key>``."""

OTEL_EACGM_DETECTOR_PREFIX = "OTEL_EACGM_DETECTOR_"
"""Prefix of the detector's settings: ``OTEL_EACGM_DETECTOR_<KEY>`` sets the detector setting ``<key>``."""

OTEL_EACGM_DETECTOR_BEARER_TOKEN = OTEL_EACGM_DETECTOR_PREFIX + "BEARER_TOKEN"
"""The token every call to the detector must carry (``authorization: Bearer <token>``, else
UNAUTHENTICATED): the setting bearer_token. Set it here rather than in a config file or on a
command line, where it would be readable by others."""

OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
"""Standard. The agent's exporters use it when the setting endpoint is unset; ``detector serve``
sends its output there when export_endpoint is unset (without the http:// or https:// scheme)."""

OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
"""Standard. The agent's default protocol (grpc or http/protobuf) when
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL is unset; otherwise grpc."""

OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
"""Standard. The agent's default protocol, before OTEL_EXPORTER_OTLP_PROTOCOL."""

OTEL_EXPORTER_OTLP_INSECURE = "OTEL_EXPORTER_OTLP_INSECURE"
"""Standard. Whether the agent's gRPC exporters skip TLS when the setting insecure is unset
(read by the OpenTelemetry SDK)."""


def agent_variables() -> dict[str, str]:
    """Each ``OTEL_EACGM_<KEY>`` variable and its meaning (the setting, its type, default and docstring)."""
    from otel_eacgm.config import AgentConfig  # noqa: PLC0415 - the config imports this module
    from otel_eacgm.settings import variables  # noqa: PLC0415

    return variables(AgentConfig)


def detector_variables() -> dict[str, str]:
    """Each ``OTEL_EACGM_DETECTOR_<KEY>`` variable and its meaning."""
    from eacgm_detector.config import DetectorConfig  # noqa: PLC0415 - imports scikit-learn
    from otel_eacgm.settings import variables  # noqa: PLC0415

    return variables(DetectorConfig)


if __name__ == "__main__":
    for name, meaning in {**agent_variables(), **detector_variables()}.items():
        print(f"{name}\n    {meaning}")
