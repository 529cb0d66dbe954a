"""NVML lifetime, GPU discovery and field-by-field reads that never fail a whole sample.

Every NVML value is read on its own through :meth:`NvmlSession.read`: a field the GPU does not
support (a datacenter GPU has no fan, a driver too old for a function) is remembered and skipped
from then on; any other NVML error is logged once per device and field and counted, and the
other fields of the sample are still reported. ``nvml`` is the ``pynvml`` module or, in tests,
a stand-in exposing the same functions, constants and exception classes.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

_LOG = logging.getLogger(__name__)

#: Error classes meaning "this device or driver cannot give this value": skip it for good.
_UNSUPPORTED_ERRORS = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound")
#: Error classes meaning "no value right now" (no process samples since the last read).
_NO_DATA_ERRORS = ("NVMLError_NotFound",)


class NvmlUnavailableError(RuntimeError):
    """NVML cannot be used on this host (no library, no driver, no GPU)."""


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as NVML enumerates it, with the ``hw.*`` attributes every GPU series carries."""

    index: int
    handle: Any
    hw_id: str
    attributes: Mapping[str, str | int] = field(default_factory=dict)


def _decode(value: bytes | str) -> str:
    # pynvml returns bytes or str depending on its version and the function.
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSession:
    """An initialised NVML with its devices; use :meth:`open`, finish with :meth:`close`."""

    def __init__(self, nvml: Any, devices: list[GpuDevice]) -> None:
        self.nvml = nvml
        self.devices = devices
        self._lock = threading.Lock()
        self._unsupported: set[tuple[int, str]] = set()
        self._warned: set[tuple[int, str]] = set()
        #: Failed reads by (field, NVML error class); exported as ``eacgm.metrics.read.errors``.
        self.errors: Counter[tuple[str, str]] = Counter()
        self._closed = False

    @classmethod
    def open(cls, nvml: ModuleType | Any | None = None) -> NvmlSession:
        """Initialise NVML and describe each GPU; raise :class:`NvmlUnavailableError` if unusable."""
        if nvml is None:
            try:
                import pynvml as nvml  # noqa: PLC0415 - only the GPU path needs it
            except ImportError as exc:
                raise NvmlUnavailableError(
                    f"the pynvml module is not importable ({exc}); install nvidia-ml-py"
                ) from exc
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailableError(f"nvmlInit failed: {exc}") from exc
        session = cls(nvml, [])
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            session.close()
            raise NvmlUnavailableError(f"nvmlDeviceGetCount failed: {exc}") from exc
        if count == 0:
            session.close()
            raise NvmlUnavailableError("NVML initialised but reports 0 GPUs")
        driver = session._system_read("hw.driver_version", nvml.nvmlSystemGetDriverVersion)
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as exc:
                _LOG.warning("GPU %d: nvmlDeviceGetHandleByIndex failed (%s); skipping it", index, exc)
                continue
            session.devices.append(session._describe(index, handle, driver))
        if not session.devices:
            session.close()
            raise NvmlUnavailableError(f"none of the {count} GPUs NVML lists could be opened")
        return session

    def _system_read(self, name: str, fn: Callable[[], Any]) -> str | None:
        try:
            return _decode(fn())
        except self.nvml.NVMLError as exc:
            _LOG.info("NVML %s unavailable: %s", name, exc)
            return None

    def _describe(self, index: int, handle: Any, driver: str | None) -> GpuDevice:
        nvml = self.nvml
        probe = GpuDevice(index=index, handle=handle, hw_id=f"gpu{index}")
        uuid = self.read(probe, "uuid", nvml.nvmlDeviceGetUUID, handle)
        attributes: dict[str, str | int] = {
            "hw.type": "gpu",
            "hw.vendor": "NVIDIA",
            "hw.name": f"gpu{index}",
            "eacgm.gpu.index": index,
        }
        optional = {
            "hw.model": self.read(probe, "name", nvml.nvmlDeviceGetName, handle),
            "hw.serial_number": self.read(probe, "serial", nvml.nvmlDeviceGetSerial, handle),
            "hw.firmware_version": self.read(probe, "vbios", nvml.nvmlDeviceGetVbiosVersion, handle),
            "hw.driver_version": driver,
        }
        pci = self.read(probe, "pci_info", nvml.nvmlDeviceGetPciInfo, handle)
        if pci is not None:
            optional["eacgm.gpu.pci.bus_id"] = pci.busId
        for key, value in optional.items():
            if value is not None:
                attributes[key] = _decode(value)
        # The UUID is stable across reboots and unique on the host, as hw.id requires; the index
        # is the fallback only for a driver that cannot report a UUID.
        hw_id = _decode(uuid) if uuid is not None else f"gpu{index}"
        attributes["hw.id"] = hw_id
        return GpuDevice(index=index, handle=handle, hw_id=hw_id, attributes=attributes)

    def read(self, device: GpuDevice, name: str, fn: Callable[..., Any], *args: Any) -> Any | None:
        """``fn(*args)``, or None when the value is unsupported, absent now, or failed (logged)."""
        key = (device.index, name)
        if key in self._unsupported or self._closed:
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            self.note_error(device, name, exc)
            return None

    def note_error(self, device: GpuDevice, name: str, exc: Exception) -> None:
        """Classify an NVML error for one field: unsupported (skip for good), no data, or failure."""
        kind = type(exc).__name__
        key = (device.index, name)
        if kind in _NO_DATA_ERRORS:
            return
        with self._lock:
            if kind in _UNSUPPORTED_ERRORS:
                if key not in self._unsupported:
                    self._unsupported.add(key)
                    _LOG.debug("GPU %d: %s not supported (%s); not read again", device.index, name, kind)
                return
            self.errors[(name, kind)] += 1
            if key not in self._warned:
                self._warned.add(key)
                _LOG.warning(
                    "GPU %d: reading %s failed: %s (%s); further failures of it are only counted",
                    device.index, name, exc, kind,
                )

    def is_unsupported(self, device: GpuDevice, name: str) -> bool:
        """True once ``name`` was found unsupported on ``device``."""
        return (device.index, name) in self._unsupported

    def field_values(self, device: GpuDevice, fields: Mapping[str, int | tuple[int, int]]) -> dict[str, float]:
        """Read NVML field ids in one call, each judged by its own return code.

        ``fields`` maps a name to a field id or ``(field id, scope id)``. Returns name -> value for
        the fields that succeeded; unsupported ones are remembered and not asked for again.
        """
        wanted = {name: fid for name, fid in fields.items() if not self.is_unsupported(device, name)}
        if not wanted or self._closed:
            return {}
        nvml = self.nvml
        try:
            values = nvml.nvmlDeviceGetFieldValues(device.handle, list(wanted.values()))
        except nvml.NVMLError as exc:
            for name in wanted:
                self.note_error(device, name, exc)
            return {}
        result: dict[str, float] = {}
        for name, value in zip(wanted, values):
            if value.nvmlReturn == nvml.NVML_SUCCESS:
                result[name] = _field_value(nvml, value)
            else:
                self.note_error(device, name, nvml.NVMLError(value.nvmlReturn))
        return result

    def close(self) -> None:
        """Shut NVML down; later reads return None. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as exc:
            _LOG.warning("nvmlShutdown failed: %s", exc)


def _field_value(nvml: Any, value: Any) -> float:
    """Pick the member of NVML's value union that ``valueType`` names."""
    member = {
        nvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
    }.get(value.valueType)
    if member is None:
        raise ValueError(f"NVML field {value.fieldId}: unknown valueType {value.valueType}")
    return getattr(value.value, member)

