"""A stand-in for the ``pynvml`` module, faked only at the function boundary.

Constants, exception classes and the field-value ctypes struct are the real ones from the
installed nvidia-ml-py, so error classification and value decoding run the real code paths; only
the functions that would call libnvidia-ml answer from a per-GPU table. A function with no
answer raises ``NVMLError_NotSupported``, as NVML does for a field a GPU lacks.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

#: Device functions answered from FakeGpu.answers (keyed by name, or (name, *extra args)).
DEVICE_FUNCTIONS = (
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses",
)
#: Functions with their own fake logic below.
OTHER_FUNCTIONS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetProcessUtilization",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
)


def nvml_error(code: int) -> pynvml.NVMLError:
    """The real pynvml exception for an NVML return code (e.g. NVMLError_NotSupported)."""
    return pynvml.NVMLError(code)


@dataclass
class FakeGpu:
    """One GPU's answers. ``fields`` maps field id or (id, scope) -> (NVML value type, value)."""

    index: int
    answers: dict[Any, Any] = field(default_factory=dict)
    fields: dict[Any, tuple[int, float]] = field(default_factory=dict)
    process_samples: list[Any] = field(default_factory=list)
    xid_supported: bool = True


class FakeNvml:
    """Module-like object exposing what otel_eacgm.metrics uses from pynvml."""

    def __init__(self, gpus: list[FakeGpu], *, driver: str = "570.124.06", init_error: int | None = None) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError", "nvmlClocksEventReason", "nvmlEventType")):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.driver = driver
        self.init_error = init_error
        self.calls: collections.Counter[str] = collections.Counter()
        self.shutdowns = 0
        self.events: collections.deque[SimpleNamespace] = collections.deque()
        self.freed_event_sets = 0
        for name in DEVICE_FUNCTIONS:
            setattr(self, name, self._device_function(name))

    def _device_function(self, name: str):  # noqa: ANN202 - fakes a pynvml function
        def call(handle: FakeGpu, *args: Any) -> Any:
            self.calls[name] += 1
            key = (name, *args) if (name, *args) in handle.answers else name
            if key not in handle.answers:
                raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            answer = handle.answers[key]
            if isinstance(answer, BaseException):
                raise answer
            return answer

        return call

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise nvml_error(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetIndex(self, handle: FakeGpu) -> int:
        return handle.index

    def nvmlDeviceGetFieldValues(self, handle: FakeGpu, field_ids: list[Any]) -> Any:
        self.calls["nvmlDeviceGetFieldValues"] += 1
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
        for slot, fid in zip(values, field_ids):
            slot.fieldId, slot.scopeId = fid if isinstance(fid, tuple) else (fid, 0)
            if fid in handle.fields:
                value_type, value = handle.fields[fid]
                slot.nvmlReturn = pynvml.NVML_SUCCESS
                slot.valueType = value_type
                setattr(slot.value, member[value_type], value)
            else:
                slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetProcessUtilization(self, handle: FakeGpu, since: int) -> list[Any]:
        self.calls["nvmlDeviceGetProcessUtilization"] += 1
        fresh = [s for s in handle.process_samples if s.timeStamp > since]
        if not fresh:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return fresh

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: FakeGpu, event_types: int, event_set: str) -> None:
        if not handle.xid_supported:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        if not self.events:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.popleft()

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.freed_event_sets += 1

    def raise_xid(self, gpu: FakeGpu, code: int) -> None:
        """Queue an XID critical-error event, as the driver would."""
        self.events.append(
            SimpleNamespace(device=gpu, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=code)
        )


def sample(pid: int, ts: int, sm: int, mem: int = 0, enc: int = 0, dec: int = 0) -> SimpleNamespace:
    """A process utilization sample shaped like c_nvmlProcessUtilizationSample_t."""
    return SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm, memUtil=mem, encUtil=enc, decUtil=dec)


def h100(index: int = 0) -> FakeGpu:
    """A datacenter GPU answering every field the agent reads (no fan, like real ones)."""
    n = pynvml
    gpu = FakeGpu(index=index)
    gpu.answers.update({
        "nvmlDeviceGetUUID": f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        "nvmlDeviceGetName": b"NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetSerial": "1650123456789",
        "nvmlDeviceGetVbiosVersion": "96.00.61.00.01",
        "nvmlDeviceGetPciInfo": SimpleNamespace(busId=f"00000000:1{index}:00.0"),
        "nvmlDeviceGetUtilizationRates": SimpleNamespace(gpu=87, memory=42),
        "nvmlDeviceGetEncoderUtilization": [5, 167000],
        "nvmlDeviceGetDecoderUtilization": [0, 167000],
        "nvmlDeviceGetMemoryInfo": SimpleNamespace(total=80 * 2**30, used=20 * 2**30, free=59 * 2**30),
        "nvmlDeviceGetPowerUsage": 312_500,
        "nvmlDeviceGetEnforcedPowerLimit": 700_000,
        "nvmlDeviceGetTotalEnergyConsumption": 123_456_789,
        ("nvmlDeviceGetTemperature", n.NVML_TEMPERATURE_GPU): 61,
        ("nvmlDeviceGetClockInfo", n.NVML_CLOCK_SM): 1980,
        ("nvmlDeviceGetClockInfo", n.NVML_CLOCK_MEM): 2619,
        ("nvmlDeviceGetClockInfo", n.NVML_CLOCK_GRAPHICS): 1980,
        "nvmlDeviceGetCurrentClocksEventReasons": n.nvmlClocksEventReasonSwPowerCap | n.nvmlClocksEventReasonSyncBoost,
        ("nvmlDeviceGetTotalEccErrors", n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC): 3,
        ("nvmlDeviceGetTotalEccErrors", n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC): 0,
        "nvmlDeviceGetGraphicsRunningProcesses": [],
        "nvmlDeviceGetComputeRunningProcesses": [
            SimpleNamespace(pid=4242, usedGpuMemory=6 * 2**30),
            SimpleNamespace(pid=4343, usedGpuMemory=None),
        ],
    })
    ull = n.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    gpu.fields.update({
        n.NVML_FI_DEV_MEMORY_TEMP: (n.NVML_VALUE_TYPE_UNSIGNED_INT, 70),
        n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: (ull, 1_000_000),
        n.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: (ull, 2_000_000),
        n.NVML_FI_DEV_NVLINK_LINK_COUNT: (n.NVML_VALUE_TYPE_UNSIGNED_INT, 2),
        (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0): (ull, 10),
        (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 1): (ull, 20),
        (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0): (ull, 1),
        (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 1): (ull, 2),
        n.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (ull, 7),
    })
    gpu.process_samples = [sample(4242, 1_000, 50, 20), sample(4242, 2_000, 80, 30, 1, 2), sample(999, 1_500, 10)]
    return gpu


def consumer_gpu(index: int = 0) -> FakeGpu:
    """A GPU that supports only the basics: no energy, ECC, NVLink, PCIe counters, encoder..."""
    gpu = FakeGpu(index=index, xid_supported=False)
    gpu.answers.update({
        "nvmlDeviceGetUUID": f"GPU-c0{index}",
        "nvmlDeviceGetName": "NVIDIA GeForce RTX 3060",
        "nvmlDeviceGetUtilizationRates": SimpleNamespace(gpu=10, memory=5),
        "nvmlDeviceGetMemoryInfo": SimpleNamespace(total=12 * 2**30, used=2**30, free=11 * 2**30 - 1),
        ("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU): 45,
        ("nvmlDeviceGetPcieThroughput", pynvml.NVML_PCIE_UTIL_TX_BYTES): 100,
        ("nvmlDeviceGetPcieThroughput", pynvml.NVML_PCIE_UTIL_RX_BYTES): 200,
    })
    return gpu
