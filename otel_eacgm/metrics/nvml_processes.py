"""Per-process GPU memory and utilization, attributed to ``process.pid``.

NVML reports processes by their pid in the host's pid namespace, the same pid the agent's BPF
probes see, so the agent's ``pid_filter`` / ``resource_for_pid`` apply directly.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opentelemetry.metrics import Observation

from otel_eacgm.metrics.attribution import ProcessAttribution
from otel_eacgm.metrics.instruments import Kind, ObservableSpec
from otel_eacgm.metrics.nvml_session import GpuDevice, NvmlSession


class _ProcessReader:
    def __init__(self, session: NvmlSession, attribution: ProcessAttribution) -> None:
        self._session = session
        self._attribution = attribution
        # Per device, the newest utilization sample seen (NVML timestamps, us): NVML returns the
        # samples newer than what we pass, so each collection sees only fresh ones.
        self._last_seen: dict[int, int] = {}

    def _observation(self, device: GpuDevice, pid: int, value: float, extra: dict[str, Any]) -> Observation:
        return Observation(value, {**device.attributes, **self._attribution.attributes(pid), **extra})

    def memory(self) -> Iterable[Observation]:
        s = self._session
        for device in s.devices:
            used: dict[int, int] = {}
            # Graphics first so a process in both lists keeps its compute context's figure.
            for kind, fn in (
                ("graphics", s.nvml.nvmlDeviceGetGraphicsRunningProcesses),
                ("compute", s.nvml.nvmlDeviceGetComputeRunningProcesses),
            ):
                for proc in s.read(device, f"{kind}_processes", fn, device.handle) or ():
                    # None: NVML cannot attribute memory (e.g. under MIG without privileges).
                    if proc.usedGpuMemory is not None and self._attribution.accepts(proc.pid):
                        used[proc.pid] = proc.usedGpuMemory
            for pid, value in sorted(used.items()):
                yield self._observation(device, pid, value, {})

    def utilization(self) -> Iterable[Observation]:
        s = self._session
        for device in s.devices:
            since = self._last_seen.get(device.index, 0)
            samples = s.read(
                device, "process_utilization", s.nvml.nvmlDeviceGetProcessUtilization, device.handle, since
            )
            newest: dict[int, Any] = {}
            for sample in samples or ():
                if sample.pid in newest and newest[sample.pid].timeStamp >= sample.timeStamp:
                    continue
                newest[sample.pid] = sample
            if newest:
                self._last_seen[device.index] = max(x.timeStamp for x in newest.values())
            for pid, sample in sorted(newest.items()):
                if not self._attribution.accepts(pid):
                    continue
                for task, percent in (("general", sample.smUtil), ("encoder", sample.encUtil), ("decoder", sample.decUtil)):
                    yield self._observation(device, pid, percent / 100, {"hw.gpu.task": task})
                yield self._observation(device, pid, sample.memUtil / 100, {"hw.gpu.task": "memory_controller"})


def process_specs(session: NvmlSession, attribution: ProcessAttribution) -> list[ObservableSpec]:
    """The per-process GPU instruments."""
    reader = _ProcessReader(session, attribution)
    return [
        ObservableSpec(
            "eacgm.gpu.process.memory.usage", Kind.UP_DOWN_COUNTER, "By",
            "GPU memory a process holds on the device.", reader.memory,
        ),
        ObservableSpec(
            "eacgm.gpu.process.utilization", Kind.GAUGE, "1",
            "Fraction of the last NVML sample period a process kept an engine (hw.gpu.task) busy.",
            reader.utilization,
        ),
    ]
