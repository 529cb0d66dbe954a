"""The agent's configuration: one typed object, loaded from YAML, environment and flags.

Precedence: command-line flag > environment (OTEL_EACGM_<KEY>) > config file > default.
The standard OTEL_EXPORTER_OTLP_* variables keep their standard meaning: when no endpoint is
configured here, the SDK exporters read them. Unknown keys and bad values raise ConfigError
naming the key, the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from otel_eacgm.export import PROTOCOLS
from otel_eacgm.probes.catalog import Layer

log = logging.getLogger(__name__)

ENV_PREFIX = "OTEL_EACGM_"
LAYER_NAMES = tuple(layer.value for layer in Layer)


class ConfigError(ValueError):
    """A configuration value is missing, unknown or invalid."""


def _default_protocol() -> str:
    return os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"


@dataclasses.dataclass
class AgentConfig:
    """Every agent setting, with its default. YAML keys are the field names (section.key)."""

    # exporter: where spans and metrics go
    protocol: str = dataclasses.field(default_factory=_default_protocol)
    """OTLP protocol: grpc or http/protobuf (default from OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)."""
    endpoint: str | None = None
    """OTLP endpoint, e.g. http://collector:4317; unset: OTEL_EXPORTER_OTLP_ENDPOINT / the SDK default."""
    insecure: bool | None = None
    """gRPC without TLS; unset: OTEL_EXPORTER_OTLP_INSECURE / scheme of the endpoint."""
    export_timeout_s: float = 10.0
    """Timeout of one export request."""
    queue_size: int = 65536
    """Spans held while the collector is slow or down; beyond it new spans are dropped and counted."""
    batch_size: int = 512
    """Spans per export request."""

    # capture: what is traced
    layers: list[str] = dataclasses.field(default_factory=lambda: list(LAYER_NAMES))
    """Layers to trace: cuda.runtime, cuda.driver, nccl."""
    launch_layer: str = Layer.CUDA_DRIVER.value
    """Where kernel launches are traced, once each: cuda.driver (sees cuBLAS/Triton launches too) or cuda.runtime."""
    launch_returns: bool = False
    """Also probe launch returns (errors and CPU-side launch time, at about 1.5x the probe cost)."""
    ringbuf_pages: int = 1024
    """BPF ring buffer size in 4 KiB pages (power of two)."""
    scan_interval_s: float = 2.0
    """Full /proc scan for newly mapped libraries (opens of watched libraries trigger a scan at once)."""
    gate_opens: bool | None = None
    """Stop a target that opens a watched library until its probes are attached (default: on with -- COMMAND)."""

    # targets
    pids: list[int] = dataclasses.field(default_factory=list)
    """Trace only these processes (and their children); empty with no cgroup: every process."""
    cgroup: str | None = None
    """Trace the processes of this cgroup v2 directory (and its descendants)."""

    # self-telemetry and logs
    metrics_interval_s: float = 10.0
    """Metric export interval (also the sampling interval of the GPU and network counters)."""
    call_metrics: bool = True
    """Call statistics from every captured call: eacgm.calls, eacgm.call.duration, eacgm.call.errors, nccl.*."""
    max_kernel_names: int = 100
    """Distinct cuda.kernel.name values per process in call statistics; the rest count as "other"."""
    gpu_metrics: bool = True
    """NVML device and per-process GPU metrics (hw.gpu.*, hw.*); off by itself when no NVML is found."""
    network_metrics: bool = True
    """Interface counters (system.network.*) and InfiniBand/RoCE port counters where present."""
    tcp_retransmits: bool = True
    """TCP retransmissions per process from the tcp:tcp_retransmit_skb tracepoint."""
    stats_log_interval_s: float = 30.0
    """Interval of the agent's summary log line (0: only at exit)."""
    log_level: str = "info"

    def validate(self) -> None:
        """Raise ConfigError naming the first invalid setting."""
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"protocol {self.protocol!r} is not one of {PROTOCOLS}")
        bad = [name for name in self.layers if name not in LAYER_NAMES]
        if bad:
            raise ConfigError(f"layers {bad} unknown; expected a subset of {list(LAYER_NAMES)}")
        if self.launch_layer not in (Layer.CUDA_RUNTIME.value, Layer.CUDA_DRIVER.value):
            raise ConfigError(f"launch_layer {self.launch_layer!r} must be cuda.runtime or cuda.driver")
        if self.ringbuf_pages <= 0 or self.ringbuf_pages & (self.ringbuf_pages - 1):
            raise ConfigError(f"ringbuf_pages {self.ringbuf_pages} must be a power of two")
        for name in ("export_timeout_s", "scan_interval_s", "metrics_interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} {getattr(self, name)} must be > 0")
        if self.max_kernel_names < 0:
            raise ConfigError(f"max_kernel_names {self.max_kernel_names} must be >= 0")
        if self.queue_size < self.batch_size or self.batch_size <= 0:
            raise ConfigError(f"queue_size {self.queue_size} must be >= batch_size {self.batch_size} > 0")
        if self.cgroup is not None and not Path(self.cgroup).is_dir():
            raise ConfigError(f"cgroup {self.cgroup!r} is not a directory (expected e.g. /sys/fs/cgroup/system.slice/train.service)")
        if self.log_level.upper() not in logging.getLevelNamesMapping():
            raise ConfigError(f"log_level {self.log_level!r} is not a logging level")

    def apply(self, values: Mapping[str, Any], source: str) -> None:
        """Overlay settings from `source` (a file name, "environment", "flags")."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        for key, raw in values.items():
            if key not in fields:
                raise ConfigError(f"{source}: unknown setting {key!r}; known: {sorted(fields)}")
            setattr(self, key, _coerce(key, raw, getattr(self, key), fields[key].type, source))


def _coerce(key: str, raw: Any, current: Any, type_name: Any, source: str) -> Any:
    text = str(type_name)
    try:
        if raw is None:
            return None
        if "list[int]" in text:
            items = raw.split(",") if isinstance(raw, str) else raw
            return [int(x) for x in items if str(x).strip()]
        if "list[str]" in text:
            items = raw.split(",") if isinstance(raw, str) else raw
            return [str(x).strip() for x in items if str(x).strip()]
        if "bool" in text:
            if isinstance(raw, bool):
                return raw
            lowered = str(raw).strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError("not a boolean")
        if "float" in text:
            return float(raw)
        if "int" in text:
            return int(raw)
        return str(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: {key}={raw!r} is invalid ({exc}); expected {text}") from None


def _flatten(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    """YAML may group keys in sections (exporter:, capture:, targets:, telemetry:)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, source))
        else:
            flat[key] = value
    return flat


def load(path: str | None = None, flags: Mapping[str, Any] | None = None,
         environ: Mapping[str, str] | None = None) -> AgentConfig:
    """Build and validate the configuration from a YAML file, the environment and flags."""
    cfg = AgentConfig()
    if path:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if not isinstance(data, Mapping):
            raise ConfigError(f"config file {path} must hold a mapping, not {type(data).__name__}")
        cfg.apply(_flatten(data, path), path)
    env = os.environ if environ is None else environ
    names = {f.name for f in dataclasses.fields(cfg)}
    from_env = {k[len(ENV_PREFIX):].lower(): v for k, v in env.items()
                if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].lower() in names}
    cfg.apply(from_env, "environment")
    cfg.apply({k: v for k, v in (flags or {}).items() if v is not None}, "flags")
    cfg.validate()
    return cfg
