"""GPU metrics mapped from NVML, against a pynvml stand-in faked only at its functions."""

from __future__ import annotations

import logging

import pynvml
import pytest
from metrics_readback import collect, one, provider, select
from nvml_fake import DEVICE_FUNCTIONS, OTHER_FUNCTIONS, FakeNvml, consumer_gpu, h100, nvml_error

from otel_eacgm.metrics.attribution import ProcessAttribution
from otel_eacgm.metrics.nvml import THROTTLE_REASONS, GpuMetrics
from otel_eacgm.metrics.nvml_session import NvmlSession, NvmlUnavailableError

GIB = 2**30


def start(nvml: FakeNvml, **kwargs):
    mp, reader = provider()
    metrics = GpuMetrics(mp.get_meter("test"), NvmlSession.open(nvml), **kwargs)
    return metrics, reader


def test_the_fake_only_fakes_functions_real_pynvml_has() -> None:
    missing = [name for name in DEVICE_FUNCTIONS + OTHER_FUNCTIONS if not callable(getattr(pynvml, name, None))]
    assert missing == []


def test_device_attributes_follow_hw_conventions() -> None:
    metrics, reader = start(FakeNvml([h100(0)]))
    point = one(collect(reader), "hw.power")
    assert point.attributes == {
        "hw.type": "gpu",
        "hw.id": "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd",
        "hw.name": "gpu0",
        "hw.vendor": "NVIDIA",
        "hw.model": "NVIDIA H100 80GB HBM3",
        "hw.serial_number": "1650123456789",
        "hw.firmware_version": "96.00.61.00.01",
        "hw.driver_version": "570.124.06",
        "eacgm.gpu.index": 0,
        "eacgm.gpu.pci.bus_id": "00000000:10:00.0",
    }
    metrics.close()


def test_every_device_value_is_mapped_with_its_unit() -> None:
    metrics, reader = start(FakeNvml([h100(0)]))
    points = collect(reader)
    assert one(points, "hw.gpu.utilization", hw__gpu__task="general").value == pytest.approx(0.87)
    assert one(points, "hw.gpu.utilization", hw__gpu__task="encoder").value == pytest.approx(0.05)
    assert one(points, "hw.gpu.utilization", hw__gpu__task="decoder").value == 0
    assert one(points, "eacgm.gpu.memory_controller.utilization").value == pytest.approx(0.42)
    assert one(points, "hw.gpu.memory.usage").value == 20 * GIB
    assert one(points, "hw.gpu.memory.limit").value == 80 * GIB
    assert one(points, "eacgm.gpu.memory.free").value == 59 * GIB
    assert one(points, "hw.gpu.memory.utilization").value == pytest.approx(0.25)
    power = one(points, "hw.power")
    assert (power.value, power.unit) == (pytest.approx(312.5), "W")
    assert one(points, "eacgm.gpu.power.limit").value == pytest.approx(700)
    energy = one(points, "hw.energy")
    assert (energy.value, energy.unit) == (pytest.approx(123_456.789), "J")
    die = one(points, "hw.temperature", hw__sensor_location="gpu")
    assert (die.value, die.unit) == (61, "Cel")
    assert die.attributes["hw.type"] == "temperature"
    assert die.attributes["hw.parent"] == "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
    assert one(points, "hw.temperature", hw__sensor_location="memory").value == 70
    sm = one(points, "eacgm.gpu.clock.frequency", eacgm__gpu__clock__domain="sm")
    assert (sm.value, sm.unit) == (1980e6, "Hz")
    assert one(points, "eacgm.gpu.clock.frequency", eacgm__gpu__clock__domain="memory").value == 2619e6
    io = {(p.attributes["eacgm.gpu.link"], p.attributes["network.io.direction"]): p.value
          for p in select(points, "hw.gpu.io")}
    assert io == {("pcie", "transmit"): 1_000_000, ("pcie", "receive"): 2_000_000,
                  ("nvlink", "transmit"): 30 * 1024, ("nvlink", "receive"): 3 * 1024}
    # PCIe counters exist, so the sampled-throughput fallback stays silent.
    assert select(points, "eacgm.gpu.pcie.throughput") == []
    throttle = {p.attributes["eacgm.gpu.throttle.reason"]: p.value for p in select(points, "eacgm.gpu.throttle.active")}
    assert set(throttle) == set(THROTTLE_REASONS)
    assert {r for r, v in throttle.items() if v} == {"sw_power_cap", "sync_boost"}
    assert one(points, "hw.errors", error__type="corrected").value == 3
    assert one(points, "hw.errors", error__type="uncorrected").value == 0
    assert one(points, "hw.errors", error__type="pcie_replay").value == 7
    metrics.close()


def test_unsupported_fields_are_skipped_alone_and_not_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([consumer_gpu(0)])
    metrics, reader = start(nvml)
    with caplog.at_level(logging.WARNING):
        points = collect(reader)
    names = {p.name for p in points}
    assert {"hw.gpu.utilization", "hw.gpu.memory.usage", "hw.temperature", "eacgm.gpu.pcie.throughput"} <= names
    assert not names & {"hw.power", "hw.energy", "eacgm.gpu.clock.frequency", "eacgm.gpu.throttle.active"}
    assert select(points, "hw.gpu.utilization", hw__gpu__task="encoder") == []
    assert select(points, "hw.temperature", hw__sensor_location="memory") == []
    assert select(points, "hw.gpu.io") == []
    # Fallback: sampled throughput, KiB/s -> By/s, because the PCIe byte counters are missing.
    assert one(points, "eacgm.gpu.pcie.throughput", network__io__direction="receive").value == 200 * 1024
    assert caplog.records == []  # not supported is normal, not a warning
    assert select(points, "eacgm.metrics.read.errors") == []
    before = nvml.calls["nvmlDeviceGetPowerUsage"]
    collect(reader)
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == before == 1
    metrics.close()


def test_a_failing_field_is_logged_once_counted_and_the_rest_still_reported(caplog: pytest.LogCaptureFixture) -> None:
    gpu = h100(0)
    gpu.answers["nvmlDeviceGetPowerUsage"] = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    metrics, reader = start(FakeNvml([gpu]))
    with caplog.at_level(logging.WARNING):
        collect(reader)
        points = collect(reader)
    assert select(points, "hw.power") == []
    assert one(points, "hw.energy").value == pytest.approx(123_456.789)
    error = one(points, "eacgm.metrics.read.errors")
    assert error.value == 2
    assert error.attributes == {"eacgm.metrics.source": "nvml", "eacgm.metrics.field": "power_usage",
                                "error.type": "NVMLError_Unknown"}
    assert [r.getMessage() for r in caplog.records if "power_usage" in r.getMessage()] == [
        "GPU 0: reading power_usage failed: Unknown Error (NVMLError_Unknown); further failures of it are only counted"
    ]
    metrics.close()


def test_each_gpu_is_its_own_series() -> None:
    metrics, reader = start(FakeNvml([h100(0), consumer_gpu(1)]))
    usage = {p.attributes["hw.name"]: p.value for p in select(collect(reader), "hw.gpu.memory.usage")}
    assert usage == {"gpu0": 20 * GIB, "gpu1": GIB}
    metrics.close()


def test_per_process_memory_and_utilization_carry_pid_and_resource() -> None:
    attribution = ProcessAttribution(lambda pid: pid != 999, lambda pid: {"service.name": f"train-{pid}"})
    metrics, reader = start(FakeNvml([h100(0)]), attribution=attribution)
    points = collect(reader)
    memory = one(points, "eacgm.gpu.process.memory.usage")
    assert (memory.value, memory.attributes["process.pid"], memory.attributes["service.name"]) == (6 * GIB, 4242, "train-4242")
    assert memory.attributes["hw.id"].startswith("GPU-")
    # pid 4343 has no attributable memory (NVML: not available); 999 is filtered out.
    util = {p.attributes["hw.gpu.task"]: p.value for p in select(points, "eacgm.gpu.process.utilization", process__pid=4242)}
    assert util == {"general": 0.8, "encoder": 0.01, "decoder": 0.02, "memory_controller": 0.3}  # newest sample
    assert select(points, "eacgm.gpu.process.utilization", process__pid=999) == []
    # Only samples newer than the last one seen are used: none new -> no utilization series.
    assert select(collect(reader), "eacgm.gpu.process.utilization") == []
    metrics.close()


def test_xid_events_count_as_hw_errors() -> None:
    gpu0, gpu1 = h100(0), h100(1)
    nvml = FakeNvml([gpu0, gpu1])
    metrics, reader = start(nvml)
    assert select(collect(reader), "hw.errors", error__type="xid") == []
    nvml.raise_xid(gpu1, 79)
    nvml.raise_xid(gpu1, 79)
    nvml.raise_xid(gpu0, 13)
    points = collect(reader)
    xids = {(p.attributes["hw.name"], p.attributes["eacgm.gpu.xid"]): p.value for p in select(points, "hw.errors", error__type="xid")}
    assert xids == {("gpu1", 79): 2, ("gpu0", 13): 1}
    metrics.close()
    assert nvml.freed_event_sets == 1


def test_no_nvml_raises_a_typed_error_with_the_cause() -> None:
    with pytest.raises(NvmlUnavailableError, match="nvmlInit failed: NVML Shared Library Not Found"):
        NvmlSession.open(FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    with pytest.raises(NvmlUnavailableError, match="0 GPUs"):
        NvmlSession.open(FakeNvml([]))


def test_close_stops_observing_and_shuts_nvml_down() -> None:
    nvml = FakeNvml([h100(0)])
    metrics, reader = start(nvml)
    metrics.close()
    metrics.close()
    assert nvml.shutdowns == 1
    assert collect(reader) == []

