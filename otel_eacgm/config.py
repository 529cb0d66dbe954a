"""The agent's configuration: one typed object, loaded from YAML, environment and flags.

Loading follows the convention of otel_eacgm.settings, shared with the detector: flag >
environment (OTEL_EACGM_<KEY>) > config file > default; unknown keys and bad values raise
ConfigError naming the key, the value and what was expected. The standard
OTEL_EXPORTER_OTLP_* variables keep their standard meaning: when no endpoint is configured
here, the SDK exporters read them (otel_eacgm.environment_variables lists every variable).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from otel_eacgm import environment_variables as env_vars
from otel_eacgm.export import PROTOCOLS
from otel_eacgm.probes import python_usdt, torch_ops
from otel_eacgm.probes.catalog import TORCH_SLOTS, Layer
from otel_eacgm.settings import ConfigError, Settings

__all__ = ["DEFAULT_LAYERS", "LAYER_NAMES", "AgentConfig", "ConfigError", "load"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
LAYER_NAMES = tuple(layer.value for layer in Layer)
PAUSE_CYCLE_MIN_S = 0.2  # a pause and a resume of every probe take tens of milliseconds each
# Python function probes cost a probe hit per Python call of the traced process (filtered in
# the kernel, but hit): opt-in.
DEFAULT_LAYERS = tuple(name for name in LAYER_NAMES if name != Layer.PYTHON.value)


def _default_protocol() -> str:
    return (os.environ.get(env_vars.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)
            or os.environ.get(env_vars.OTEL_EXPORTER_OTLP_PROTOCOL) or "grpc")


@dataclasses.dataclass
class AgentConfig(Settings):
    """Every agent setting, with its default. YAML keys are the field names, optionally grouped
    in sections (exporter:, capture:, ...)."""

    ENV_PREFIX: ClassVar[str] = env_vars.OTEL_EACGM_PREFIX

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
    layers: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_LAYERS))
    """Layers to trace: cuda.runtime, cuda.driver, nccl, torch, python (python is opt-in: a probe hit per Python call)."""
    launch_layer: str = Layer.CUDA_DRIVER.value
    """Where kernel launches are traced, once each: cuda.driver (sees cuBLAS/Triton launches too) or cuda.runtime."""
    launch_returns: bool = False
    """Also probe launch returns (errors and CPU-side launch time, at about 1.5x the probe cost)."""
    ringbuf_pages: int = 1024
    """BPF ring buffer size in 4 KiB pages (power of two)."""
    uprobe_multi: bool = True
    """Attach probes as uprobe_multi links where the kernel has them (6.6+): attached and released
    in one step per library; off: one perf event per probe (slow to release; only launches are cycled)."""
    scan_interval_s: float = 2.0
    """Full /proc scan for newly mapped libraries (opens of watched libraries trigger a scan at once)."""
    gate_opens: bool | None = None
    """Stop a target that opens a watched library until its probes are attached (default: on with -- COMMAND
    or scoped_probes)."""
    scoped_probes: bool = True
    """With --pid, --cgroup or -- COMMAND: link probes per traced process, so that processes outside the
    scope that map the same library take no trap (new children are held at birth until linked); false:
    probes on the library file, every process mapping it traps. Node-wide tracing is always file-wide."""

    # PyTorch operators and Python functions (docs/tracing-layers.md)
    torch_include: list[str] = dataclasses.field(default_factory=lambda: list(torch_ops.DEFAULT_INCLUDE))
    """ATen operators to probe: fnmatch patterns on the operator (addmm, aten::addmm) or operator.overload (add.Tensor)."""
    torch_exclude: list[str] = dataclasses.field(default_factory=lambda: list(torch_ops.DEFAULT_EXCLUDE))
    """ATen operators never probed, same patterns (default: the out= variants)."""
    torch_max_ops: int = len(TORCH_SLOTS)
    """Cap on probed operators per libtorch_cpu, at most 256 (earlier torch_include patterns win); logged when it
    bites. The default patterns' specific operators all fit; the cap drops only generic *_backward and _foreach_*."""
    torch_shed_share: float = 0.01
    """Stop probing an operator whose probes cost at least this share of a thread and whose calls last less than
    5 times their two probe hits (high-rate tiny operators; logged, gauge eacgm.agent.operators.shed; 0: never)."""
    python_include: list[str] = dataclasses.field(default_factory=lambda: list(python_usdt.DEFAULT_INCLUDE))
    """Python functions traced though python_exclude matches them: MODULE[:FUNCTION], :FUNCTION or <PREFIX."""
    python_exclude: list[str] = dataclasses.field(default_factory=lambda: list(python_usdt.DEFAULT_EXCLUDE))
    """Python functions not traced (default: stdlib, site-packages, frozen code, module bodies)."""
    python_default_include: bool = True
    """Trace Python functions no pattern matches (the user's own code)."""
    python_frames: bool = True
    """Read the Python frames above each outermost traced call (any CPython 3.10-3.14, no USDT
    needed) and show them as spans over the calls they made; the include/exclude rules apply."""
    python_frame_depth: int = 64
    """Python frames read per traced call, innermost first (at most 64)."""

    # trace shaping and sampling
    trace_max_spans: int = 1000
    """Spans per trace; larger subtrees are split into one trace per child of the open call."""
    trace_max_delay_s: float = 10.0
    """Longest a completed call waits for its still-open parent before its subtree is its own trace."""
    trace_slice_s: float = 1.0
    """Outermost calls with nothing under them share one trace per thread and slice (0: one trace each)."""
    span_sample_ratio: float = 0.1
    """Fraction of traces exported whole; slow and failed spans are exported always (1.0: everything)."""
    span_slow_s: float = 0.01
    """A span at least this long is exported whatever the sampling."""
    span_slice_max: int = 4096
    """Spans one thread may send in one sampled slice; its later calls are counted, not sent (0: no cap;
    not applied at span_sample_ratio 1). A launch-bound thread would otherwise overflow the ring buffer."""
    perfetto: str | None = None
    """Also write spans to this Chrome/Perfetto trace file (JSON)."""
    otlp: bool = True
    """Export spans and metrics over OTLP (off: only the Perfetto file)."""

    # targets
    pids: list[int] = dataclasses.field(default_factory=list)
    """Trace only these processes (and their children); empty with no cgroup: every process."""
    cgroup: str | None = None
    """Trace the processes of this cgroup v2 directory (and its descendants)."""

    # resource attributes of traced processes (opt-in: command lines and environments hold secrets)
    resource_command_line: bool = False
    """Add the traced process' argv as process.command_args to its resource."""
    resource_environment: list[str] = dataclasses.field(default_factory=list)
    """Environment variables of the traced process to add as process.environment_variable.<NAME> (exact names)."""

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
    # overhead guardrail (otel_eacgm/guardrail.py)
    overhead_budget: float = 0.05
    """Probe time a traced process may spend, as a share of its wall time (0: no guardrail)."""
    probe_hit_cost_us: float = 2.0
    """Cost of one uprobe hit inside a real job, a floor: while probes are cycled the agent measures the cost and uses it
    when higher (H200: 0.74 us in a tight loop, about 2 us inside PyTorch steps, 6 us in a noisy stretch; docs/design.md)."""
    guardrail_period_s: float = 2.0
    """Duty-cycle period of probes the guardrail throttles (longer when the duty is below 0.25 s / period)."""
    guardrail_min_duty: float = 0.05
    """A throttled probe stays attached at least this share of each period."""
    # measuring the agent's own overhead (otel_eacgm/pause_cycle.py)
    pause_cycle_s: float = 0.0
    """Measurement mode: pause every probe and resume it in alternating blocks of this many seconds (0: off), so that
    one run compares a job's steps with and without probes (benchmarks/overhead_paired.py)."""
    pause_cycle_log: str = ""
    """File the pause cycle appends each switch to: JSON lines with its CLOCK_MONOTONIC start and end in ns."""
    stats_log_interval_s: float = 30.0
    """Interval of the agent's summary log line (0: only at exit)."""
    log_level: str = "info"
    """Level of the agent's own log: debug, info, warning, error or critical."""

    def validate(self) -> AgentConfig:
        """Raise ConfigError naming the first invalid setting; return self."""
        super().validate()
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
        if not 0.0 <= self.torch_shed_share < 1.0:
            raise ConfigError(f"torch_shed_share {self.torch_shed_share} must be in [0, 1)")
        if not 0 < self.torch_max_ops <= len(TORCH_SLOTS):
            raise ConfigError(f"torch_max_ops {self.torch_max_ops} must be in [1, {len(TORCH_SLOTS)}]")
        try:
            python_usdt.compile_rules(self.python_include, self.python_exclude)
        except ValueError as exc:
            raise ConfigError(f"python_include/python_exclude: {exc}") from None
        if not 1 <= self.python_frame_depth <= 64:
            raise ConfigError(f"python_frame_depth {self.python_frame_depth} must be in [1, 64]")
        if self.trace_max_spans < 1:
            raise ConfigError(f"trace_max_spans {self.trace_max_spans} must be >= 1")
        if self.trace_max_delay_s <= 0 or self.trace_slice_s < 0:
            raise ConfigError(f"trace_max_delay_s {self.trace_max_delay_s} must be > 0 and trace_slice_s "
                              f"{self.trace_slice_s} >= 0")
        if not 0.0 <= self.span_sample_ratio <= 1.0:
            raise ConfigError(f"span_sample_ratio {self.span_sample_ratio} must be in [0, 1]")
        if self.span_slice_max < 0:
            raise ConfigError(f"span_slice_max {self.span_slice_max} must be >= 0 (0: no cap)")
        if self.span_slow_s < 0:
            raise ConfigError(f"span_slow_s {self.span_slow_s} must be >= 0")
        if not self.otlp and not self.perfetto:
            raise ConfigError("otlp is off and no perfetto file is set: spans would go nowhere")
        if not 0.0 <= self.overhead_budget < 1.0:
            raise ConfigError(f"overhead_budget {self.overhead_budget} must be in [0, 1)")
        if self.probe_hit_cost_us <= 0 or self.guardrail_period_s <= 0:
            raise ConfigError(f"probe_hit_cost_us {self.probe_hit_cost_us} and guardrail_period_s "
                              f"{self.guardrail_period_s} must be > 0")
        if not 0.0 < self.guardrail_min_duty <= 1.0:
            raise ConfigError(f"guardrail_min_duty {self.guardrail_min_duty} must be in (0, 1]")
        if self.pause_cycle_s and self.pause_cycle_s < PAUSE_CYCLE_MIN_S or self.pause_cycle_s < 0:
            raise ConfigError(f"pause_cycle_s {self.pause_cycle_s} must be 0 (off) or >= {PAUSE_CYCLE_MIN_S}")
        if self.pause_cycle_log and not Path(self.pause_cycle_log).parent.is_dir():
            raise ConfigError(f"pause_cycle_log {self.pause_cycle_log!r}: its directory does not exist")
        if self.max_kernel_names < 0:
            raise ConfigError(f"max_kernel_names {self.max_kernel_names} must be >= 0")
        if self.queue_size < self.batch_size or self.batch_size <= 0:
            raise ConfigError(f"queue_size {self.queue_size} must be >= batch_size {self.batch_size} > 0")
        bad_env = [n for n in self.resource_environment if not _ENV_NAME.fullmatch(n)]
        if bad_env:
            raise ConfigError(f"resource_environment {bad_env} are not environment variable names (e.g. SLURM_JOB_ID)")
        if self.cgroup is not None and not Path(self.cgroup).is_dir():
            raise ConfigError(f"cgroup {self.cgroup!r} is not a directory (expected e.g. /sys/fs/cgroup/system.slice/train.service)")
        if self.log_level.upper() not in logging.getLevelNamesMapping():
            raise ConfigError(f"log_level {self.log_level!r} is not a logging level")
        return self


def load(path: str | None = None, flags: Mapping[str, Any] | None = None,
         environ: Mapping[str, str] | None = None) -> AgentConfig:
    """Build and validate the configuration from a YAML file, the environment and flags."""
    return AgentConfig.load(path, flags, environ)
