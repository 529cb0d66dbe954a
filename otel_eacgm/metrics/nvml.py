"""Per-GPU metrics from NVML under OpenTelemetry ``hw.*`` names (``eacgm.gpu.*`` for the rest).

Each instrument below reads its own NVML values for every GPU at each collection, through
:meth:`NvmlSession.read`, so an unsupported or failing field drops that one value only.
Per-process GPU metrics live in :mod:`otel_eacgm.metrics.nvml_processes`, XID events in
:mod:`otel_eacgm.metrics.nvml_xid`; :class:`GpuMetrics` wires the three.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.metrics import Meter, Observation

from otel_eacgm.metrics.attribution import ProcessAttribution
from otel_eacgm.metrics.instruments import Kind, ObservableSpec, register
from otel_eacgm.metrics.nvml_processes import process_specs
from otel_eacgm.metrics.nvml_session import GpuDevice, NvmlSession
from otel_eacgm.metrics.nvml_xid import XidWatcher

_LOG = logging.getLogger(__name__)

Reading = tuple[float, Mapping[str, Any]]
DeviceReader = Callable[[NvmlSession, GpuDevice], Iterable[Reading]]

_MHZ = 1_000_000
_KIB = 1024

#: NVML clock domains reported by ``eacgm.gpu.clock.frequency`` (constant name in pynvml).
CLOCK_DOMAINS = {"sm": "NVML_CLOCK_SM", "memory": "NVML_CLOCK_MEM", "graphics": "NVML_CLOCK_GRAPHICS"}

#: NVML clock-event ("throttle") reasons, attribute value -> bit constant name in pynvml.
THROTTLE_REASONS = {
    "gpu_idle": "nvmlClocksEventReasonGpuIdle",
    "applications_clocks_setting": "nvmlClocksEventReasonApplicationsClocksSetting",
    "sw_power_cap": "nvmlClocksEventReasonSwPowerCap",
    "hw_slowdown": "nvmlClocksEventReasonHwSlowdown",
    "sync_boost": "nvmlClocksEventReasonSyncBoost",
    "sw_thermal_slowdown": "nvmlClocksEventReasonSwThermalSlowdown",
    "hw_thermal_slowdown": "nvmlClocksEventReasonHwThermalSlowdown",
    "hw_power_brake_slowdown": "nvmlClocksEventReasonHwPowerBrakeSlowdown",
    "display_clock_setting": "nvmlClocksEventReasonDisplayClockSetting",
}

_TRANSMIT = {"network.io.direction": "transmit"}
_RECEIVE = {"network.io.direction": "receive"}


def _utilization(s: NvmlSession, d: GpuDevice) -> Iterable[Reading]:
    nvml = s.nvml
    rates = s.read(d, "utilization", nvml.nvmlDeviceGetUtilizationRates, d.handle)
    if rates is not None:
        yield rates.gpu / 100, {"hw.gpu.task": "general"}
    for task, fn in (
        ("encoder", nvml.nvmlDeviceGetEncoderUtilization),
        ("decoder", nvml.nvmlDeviceGetDecoderUtilization),
    ):
        # Both return [percent, sampling period in us].
        sample = s.read(d, f"{task}_utilization", fn, d.handle)
        if sample is not None:
            yield sample[0] / 100, {"hw.gpu.task": task}


def _memory_controller_utilization(s: NvmlSession, d: GpuDevice) -> Iterable[Reading]:
    rates = s.read(d, "utilization", s.nvml.nvmlDeviceGetUtilizationRates, d.handle)
    if rates is not None:
        yield rates.memory / 100, {}


def _memory(member: str) -> DeviceReader:
    def read(s: NvmlSession, d: GpuDevice) -> Iterable[Reading]:
        info = s.read(d, "memory_info", s.nvml.nvmlDeviceGetMemoryInfo, d.handle)
        if info is not None:
            yield getattr(info, member), {}

    return read


def _memory_utilization(s: NvmlSession, d: GpuDevice) -> Iterable[Reading]:
    info = s.read(d, "memory_info", s.nvml.nvmlDeviceGetMemoryInfo, d.handle)
    if info is not None and info.total:
        yield info.used / info.total, {}


def _power(s: NvmlSession, d: GpuDevice) -> Iterable[Reading]:
    milliwatts = s.read(d, "power_usage", s.nvml.nvmlDeviceGetPowerUsage, d.handle)
    if milliwatts is not None:
        yield milliwatts / 1000, {}


def _power_limit(s: NvmlSession, d: GpuDevice) -> Iterable[Reading]:
    milliwatts = s.read(d, "power_limit", s.nvml.nvmlDeviceGetEnforcedPowerLimit, d.handle)
    if milliwatts is not None:
        yield milliwatts / 1000, {}


def _energy(s: NvmlSession, d: GpuDevice) -> Iterable[Reading]:
    millijoules = s.read(d, "total_energy", s.nvml.nvmlDeviceGetTotalEnergyConsumption, d.handle)
    if millijoules is not None:
        yield millijoules / 1000, {}


def _temperature_sensor(d: GpuDevice, location: str) -> dict[str, Any]:
    # In the hw.* conventions a temperature is its own component (hw.type=temperature) whose
    # parent is the GPU; the GPU's descriptive attributes still ride along for filtering.
    return {
        "hw.type": "temperature",
        "hw.id": f"{d.hw_id}_temperature_{location}",
        "hw.name": f"{d.attributes.get('hw.name', d.hw_id)} {location}",
        "hw.parent": d.hw_id,
        "hw.sensor_location": location,
    }


def _temperature(s: NvmlSession, d: GpuDevice) -> Iterable[Reading]:
    nvml = s.nvml
    celsius = s.read(d, "temperature", nvml.nvmlDeviceGetTemperature, d.handle, nvml.NVML_TEMPERATURE_GPU)
    if celsius is not None:
        yield celsius, _temperature_sensor(d, "gpu")
    fields = s.field_values(d, {"memory_temperature": nvml.NVML_FI_DEV_MEMORY_TEMP})
    if "memory_temperature" in fields:
        yield fields["memory_temperature"], _temperature_sensor(d, "memory")


def _clocks(s: NvmlSession, d: GpuDevice) -> Iterable[Reading]:
    nvml = s.nvml
    for domain, constant in CLOCK_DOMAINS.items():
        mhz = s.read(d, f"clock_{domain}", nvml.nvmlDeviceGetClockInfo, d.handle, getattr(nvml, constant))
        if mhz is not None:
            yield mhz * _MHZ, {"eacgm.gpu.clock.domain": domain}


def _pcie_counter_fields(nvml: Any) -> dict[str, int]:
    return {"pcie_tx_bytes": nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, "pcie_rx_bytes": nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES}


def _nvlink_count(s: NvmlSession, d: GpuDevice) -> int:
    fields = s.field_values(d, {"nvlink_link_count": s.nvml.NVML_FI_DEV_NVLINK_LINK_COUNT})
    return int(fields.get("nvlink_link_count", 0))


def _io(s: NvmlSession, d: GpuDevice) -> Iterable[Reading]:
    nvml = s.nvml
    pcie = s.field_values(d, _pcie_counter_fields(nvml))
    if "pcie_tx_bytes" in pcie:
        yield pcie["pcie_tx_bytes"], {**_TRANSMIT, "eacgm.gpu.link": "pcie"}
    if "pcie_rx_bytes" in pcie:
        yield pcie["pcie_rx_bytes"], {**_RECEIVE, "eacgm.gpu.link": "pcie"}
    links = _nvlink_count(s, d)
    if links:
        # Throughput fields are cumulative KiB per link (scope id = link); summed over links.
        wanted = {}
        for link in range(links):
            wanted[f"nvlink_tx_kib_{link}"] = (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link)
            wanted[f"nvlink_rx_kib_{link}"] = (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link)
        values = s.field_values(d, wanted)
        for prefix, direction in (("nvlink_tx_kib_", _TRANSMIT), ("nvlink_rx_kib_", _RECEIVE)):
            got = [v for name, v in values.items() if name.startswith(prefix)]
            if got:
                yield sum(got) * _KIB, {**direction, "eacgm.gpu.link": "nvlink"}


def _pcie_throughput(s: NvmlSession, d: GpuDevice) -> Iterable[Reading]:
    nvml = s.nvml
    # Only where the cumulative PCIe byte counters are missing: this call samples for ~20 ms
    # per direction, and hw.gpu.io already carries the better data when the counters exist.
    if not all(s.is_unsupported(d, name) for name in _pcie_counter_fields(nvml)):
        return
    for name, counter, direction in (
        ("pcie_tx_throughput", nvml.NVML_PCIE_UTIL_TX_BYTES, _TRANSMIT),
        ("pcie_rx_throughput", nvml.NVML_PCIE_UTIL_RX_BYTES, _RECEIVE),
    ):
        kib_per_s = s.read(d, name, nvml.nvmlDeviceGetPcieThroughput, d.handle, counter)
        if kib_per_s is not None:
            yield kib_per_s * _KIB, dict(direction)


def _throttle(s: NvmlSession, d: GpuDevice) -> Iterable[Reading]:
    nvml = s.nvml
    mask = s.read(d, "clocks_event_reasons", nvml.nvmlDeviceGetCurrentClocksEventReasons, d.handle)
    if mask is None:
        return
    for reason, constant in THROTTLE_REASONS.items():
        yield (1 if mask & getattr(nvml, constant) else 0), {"eacgm.gpu.throttle.reason": reason}


def _errors(xid: XidWatcher | None) -> DeviceReader:
    def read(s: NvmlSession, d: GpuDevice) -> Iterable[Reading]:
        nvml = s.nvml
        for error_type, constant in (
            ("corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            count = s.read(
                d, f"ecc_{error_type}", nvml.nvmlDeviceGetTotalEccErrors, d.handle, constant, nvml.NVML_VOLATILE_ECC
            )
            if count is not None:
                yield count, {"error.type": error_type, "eacgm.gpu.error.source": "ecc"}
        replay = s.field_values(d, {"pcie_replay": nvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER})
        if "pcie_replay" in replay:
            yield replay["pcie_replay"], {"error.type": "pcie_replay", "eacgm.gpu.error.source": "pcie"}
        if xid is not None:
            for code, count in xid.counts(d).items():
                yield count, {"error.type": "xid", "eacgm.gpu.error.source": "xid", "eacgm.gpu.xid": code}

    return read


def device_catalog(xid: XidWatcher | None) -> list[tuple[str, Kind, str, str, DeviceReader]]:
    """(name, kind, unit, description, reader) for every per-device GPU instrument."""
    return [
        ("hw.gpu.utilization", Kind.GAUGE, "1", "Fraction of time the GPU engine (hw.gpu.task) was busy.", _utilization),
        ("eacgm.gpu.memory_controller.utilization", Kind.GAUGE, "1",
         "Fraction of time device memory was being read or written.", _memory_controller_utilization),
        ("hw.gpu.memory.usage", Kind.UP_DOWN_COUNTER, "By", "GPU memory in use.", _memory("used")),
        ("hw.gpu.memory.limit", Kind.UP_DOWN_COUNTER, "By", "Size of the GPU memory.", _memory("total")),
        ("eacgm.gpu.memory.free", Kind.UP_DOWN_COUNTER, "By",
         "GPU memory free (NVML's figure; total - used - driver-reserved).", _memory("free")),
        ("hw.gpu.memory.utilization", Kind.GAUGE, "1", "Fraction of GPU memory used.", _memory_utilization),
        ("hw.power", Kind.GAUGE, "W", "Instantaneous GPU power draw.", _power),
        ("eacgm.gpu.power.limit", Kind.GAUGE, "W", "Power limit the driver enforces.", _power_limit),
        ("hw.energy", Kind.COUNTER, "J", "Energy the GPU consumed since the driver loaded.", _energy),
        ("hw.temperature", Kind.GAUGE, "Cel", "GPU die and memory temperature.", _temperature),
        ("eacgm.gpu.clock.frequency", Kind.GAUGE, "Hz", "Current clock of a GPU clock domain.", _clocks),
        ("hw.gpu.io", Kind.COUNTER, "By", "Bytes the GPU moved over PCIe and NVLink.", _io),
        ("eacgm.gpu.pcie.throughput", Kind.GAUGE, "By/s",
         "PCIe throughput sampled by NVML (only where hw.gpu.io has no PCIe counters).", _pcie_throughput),
        ("eacgm.gpu.throttle.active", Kind.GAUGE, "1", "1 while a clock-event (throttle) reason is active.", _throttle),
        ("hw.errors", Kind.COUNTER, "{error}", "GPU errors: ECC (volatile), PCIe replays, XID events.", _errors(xid)),
    ]


class GpuMetrics:
    """All GPU instruments over one :class:`NvmlSession`; :meth:`close` shuts NVML down."""

    def __init__(
        self,
        meter: Meter,
        session: NvmlSession,
        *,
        attribution: ProcessAttribution | None = None,
        watch_xid: bool = True,
    ) -> None:
        self._session = session
        self._open = True
        self._xid = XidWatcher.start(session) if watch_xid else None
        specs = [
            ObservableSpec(name, kind, unit, description, self._per_device(reader))
            for name, kind, unit, description, reader in device_catalog(self._xid)
        ]
        specs += process_specs(session, attribution or ProcessAttribution())
        specs.append(
            ObservableSpec(
                "eacgm.metrics.read.errors", Kind.COUNTER, "{error}",
                "Failed NVML reads by field and NVML error class (unsupported fields excluded).",
                self._read_errors,
            )
        )
        register(meter, specs, lambda: self._open)
        _LOG.info(
            "GPU metrics on %d GPU(s): %s",
            len(session.devices),
            ", ".join(f"{d.index}={d.attributes.get('hw.model', '?')}" for d in session.devices),
        )

    def _per_device(self, reader: DeviceReader) -> Callable[[], Iterable[Observation]]:
        def observe() -> Iterable[Observation]:
            for device in self._session.devices:
                for value, extra in reader(self._session, device):
                    yield Observation(value, {**device.attributes, **extra})

        return observe

    def _read_errors(self) -> Iterable[Observation]:
        for (field, error), count in sorted(self._session.errors.items()):
            yield Observation(count, {"eacgm.metrics.source": "nvml", "eacgm.metrics.field": field, "error.type": error})

    def close(self) -> None:
        """Stop observing and release NVML; safe to call twice."""
        if not self._open:
            return
        self._open = False
        if self._xid is not None:
            self._xid.close()
        self._session.close()
