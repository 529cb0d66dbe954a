"""Start every host metrics source the agent asked for; one failing source never stops the rest.

The agent owns the MeterProvider and its PeriodicExportingMetricReader; the sources here only
register observable instruments, which the reader polls at its export interval. Each source has
its own meter (instrumentation scope), so the scope tells where a series came from and two
sources may share a semantic-convention name (``hw.errors`` for GPUs and RDMA ports).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, Protocol

from opentelemetry.metrics import Meter, MeterProvider

from otel_eacgm import __version__
from otel_eacgm.bpf_program import BpfError
from otel_eacgm.metrics.attribution import ProcessAttribution
from otel_eacgm.metrics.infiniband import InfinibandMetrics
from otel_eacgm.metrics.net_bpf import NetProgram
from otel_eacgm.metrics.network import NetworkMetrics
from otel_eacgm.metrics.nvml import GpuMetrics
from otel_eacgm.metrics.nvml_session import NvmlSession, NvmlUnavailableError
from otel_eacgm.metrics.tcp_retransmit import TcpRetransmitMetrics

_LOG = logging.getLogger(__name__)

SCOPE_PREFIX = "otel_eacgm.metrics"


class _Closeable(Protocol):
    def close(self) -> None: ...


class HostMetrics:
    """The sources that started; :meth:`close` stops them in reverse order."""

    def __init__(self, sources: Mapping[str, _Closeable]) -> None:
        self.sources = dict(sources)

    def close(self) -> None:
        """Stop every source (NVML shut down, BPF program unloaded); safe to call twice."""
        for name, source in reversed(list(self.sources.items())):
            source.close()
            _LOG.debug("host metrics source %s closed", name)
        self.sources.clear()


def start_host_metrics(
    meter_provider: MeterProvider,
    *,
    gpu: bool = True,
    network: bool = True,
    tcp_retransmits: bool = True,
    pid_filter: Callable[[int], bool] | None = None,
    resource_for_pid: Callable[[int], Mapping[str, Any] | None] | None = None,
    root: str = "/",
    nvml: ModuleType | Any | None = None,
) -> HostMetrics:
    """Register the GPU, network (+ InfiniBand) and TCP-retransmit instruments that can run here.

    ``pid_filter`` limits per-process series (GPU memory / utilization, TCP retransmits) to the
    pids it accepts; ``resource_for_pid`` adds attributes of the traced process to them. An
    unavailable GPU or BPF logs one line and leaves the other sources running. ``root`` and
    ``nvml`` exist for tests (fixture trees, a stand-in pynvml).
    """
    attribution = ProcessAttribution(pid_filter, resource_for_pid)
    sources: dict[str, _Closeable] = {}

    def meter(name: str) -> Meter:
        return meter_provider.get_meter(f"{SCOPE_PREFIX}.{name}", __version__)

    if gpu:
        try:
            session = NvmlSession.open(nvml)
        except NvmlUnavailableError as exc:
            _LOG.warning("GPU metrics off: %s", exc)
        else:
            sources["gpu"] = GpuMetrics(meter("nvml"), session, attribution=attribution)
    if network:
        sources["network"] = NetworkMetrics(meter("network"), root=root)
        if os.path.isdir(os.path.join(root, "sys/class/infiniband")):
            sources["infiniband"] = InfinibandMetrics(meter("infiniband"), root=root)
        else:
            _LOG.info("no /sys/class/infiniband: InfiniBand/RoCE port metrics off")
    if tcp_retransmits:
        try:
            program = NetProgram()
        except BpfError as exc:
            _LOG.warning("TCP retransmit metrics off: %s", exc)
        else:
            sources["tcp_retransmits"] = TcpRetransmitMetrics(
                meter("tcp"), program, attribution=attribution, root=root
            )
    _LOG.info("host metrics started: %s", ", ".join(sources) or "none")
    return HostMetrics(sources)
