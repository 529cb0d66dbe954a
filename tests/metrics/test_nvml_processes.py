"""Per-process GPU memory and utilization, against the pynvml stand-in (faked at its functions)."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest
from metrics_readback import collect, one, provider, select
from nvml_fake import FakeNvml, h100, nvml_error, sample

from otel_eacgm.metrics.attribution import ProcessAttribution
from otel_eacgm.metrics.instruments import Kind, register
from otel_eacgm.metrics.nvml_processes import process_specs
from otel_eacgm.metrics.nvml_session import NvmlSession

GIB = 2**30


def proc(pid: int, used: int | None) -> SimpleNamespace:
    """A running-process entry shaped like c_nvmlProcessInfo_t."""
    return SimpleNamespace(pid=pid, usedGpuMemory=used)


def specs_for(nvml: FakeNvml, attribution: ProcessAttribution | None = None):  # noqa: ANN201
    session = NvmlSession.open(nvml)
    memory, utilization = process_specs(session, attribution or ProcessAttribution())
    return session, memory, utilization


def observed(spec) -> list[tuple[float, dict]]:  # noqa: ANN001
    return [(o.value, dict(o.attributes)) for o in spec.observe()]


def test_the_two_instruments_and_their_units() -> None:
    _, memory, utilization = specs_for(FakeNvml([h100(0)]))
    assert (memory.name, memory.kind, memory.unit) == ("eacgm.gpu.process.memory.usage", Kind.UP_DOWN_COUNTER, "By")
    assert (utilization.name, utilization.kind, utilization.unit) == ("eacgm.gpu.process.utilization", Kind.GAUGE, "1")


def test_memory_per_pid_carries_device_and_process_attributes() -> None:
    gpu = h100(0)
    gpu.answers["nvmlDeviceGetComputeRunningProcesses"] = [proc(30, 2 * GIB), proc(10, GIB), proc(20, None)]
    _, memory, _ = specs_for(FakeNvml([gpu]), ProcessAttribution(None, lambda pid: {"service.name": f"svc{pid}"}))
    points = observed(memory)
    # pid 20: NVML cannot attribute its memory (None), so no series rather than a zero.
    assert [(v, a["process.pid"], a["service.name"]) for v, a in points] == [(GIB, 10, "svc10"), (2 * GIB, 30, "svc30")]
    assert points[0][1]["hw.id"] == "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
    assert points[0][1]["hw.type"] == "gpu"
    assert points[0][1]["eacgm.gpu.index"] == 0


def test_a_process_in_both_lists_reports_its_compute_figure_once() -> None:
    gpu = h100(0)
    gpu.answers["nvmlDeviceGetGraphicsRunningProcesses"] = [proc(7, 100), proc(8, 200)]
    gpu.answers["nvmlDeviceGetComputeRunningProcesses"] = [proc(7, 5 * GIB)]
    _, memory, _ = specs_for(FakeNvml([gpu]))
    assert [(a["process.pid"], v) for v, a in observed(memory)] == [(7, 5 * GIB), (8, 200)]


def test_pid_filter_and_resource_never_override_process_pid() -> None:
    gpu = h100(0)
    gpu.answers["nvmlDeviceGetComputeRunningProcesses"] = [proc(1, 10), proc(2, 20)]
    attribution = ProcessAttribution(lambda pid: pid == 2, lambda pid: {"process.pid": -1, "k8s.pod.name": "p"})
    _, memory, _ = specs_for(FakeNvml([gpu]), attribution)
    [(value, attrs)] = observed(memory)
    assert (value, attrs["process.pid"], attrs["k8s.pod.name"]) == (20, 2, "p")


def test_unsupported_graphics_list_still_reports_compute_and_is_not_asked_again() -> None:
    gpu = h100(0)
    del gpu.answers["nvmlDeviceGetGraphicsRunningProcesses"]  # the fake then answers NotSupported
    nvml = FakeNvml([gpu])
    session, memory, _ = specs_for(nvml)
    assert [(a["process.pid"], v) for v, a in observed(memory)] == [(4242, 6 * GIB)]
    observed(memory)
    assert nvml.calls["nvmlDeviceGetGraphicsRunningProcesses"] == 1
    assert nvml.calls["nvmlDeviceGetComputeRunningProcesses"] == 2
    assert session.errors == {}


def test_a_failing_process_list_is_counted_and_the_other_gpu_still_reported() -> None:
    gpu0, gpu1 = h100(0), h100(1)
    gpu0.answers["nvmlDeviceGetComputeRunningProcesses"] = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    gpu1.answers["nvmlDeviceGetComputeRunningProcesses"] = [proc(5, 123)]
    session, memory, _ = specs_for(FakeNvml([gpu0, gpu1]))
    assert [(a["hw.name"], a["process.pid"], v) for v, a in observed(memory)] == [("gpu1", 5, 123)]
    assert session.errors == {("compute_processes", "NVMLError_GpuIsLost"): 1}


def test_utilization_reports_the_newest_sample_of_each_pid_as_fractions() -> None:
    gpu = h100(0)
    gpu.process_samples = [sample(1, 100, sm=10), sample(1, 300, sm=75, mem=40, enc=3, dec=4), sample(1, 200, sm=99),
                           sample(2, 150, sm=20)]
    _, _, utilization = specs_for(FakeNvml([gpu]))
    by = {(a["process.pid"], a["hw.gpu.task"]): v for v, a in observed(utilization)}
    assert by == {
        (1, "general"): 0.75, (1, "encoder"): 0.03, (1, "decoder"): 0.04, (1, "memory_controller"): 0.40,
        (2, "general"): 0.20, (2, "encoder"): 0.0, (2, "decoder"): 0.0, (2, "memory_controller"): 0.0,
    }


def test_utilization_asks_only_for_samples_newer_than_the_last_seen_per_gpu() -> None:
    gpu0, gpu1 = h100(0), h100(1)
    gpu0.process_samples = [sample(1, 1_000, 10), sample(2, 5_000, 20)]
    gpu1.process_samples = [sample(3, 700, 30)]
    nvml = FakeNvml([gpu0, gpu1])
    asked: list[tuple[int, int]] = []
    real = nvml.nvmlDeviceGetProcessUtilization

    def recording(handle, since):  # noqa: ANN001, ANN202
        asked.append((handle.index, since))
        return real(handle, since)

    nvml.nvmlDeviceGetProcessUtilization = recording
    session, _, utilization = specs_for(nvml)
    first = {(a["hw.name"], a["process.pid"]) for _, a in observed(utilization)}
    assert first == {("gpu0", 1), ("gpu0", 2), ("gpu1", 3)}
    # Nothing new: NVML answers NOT_FOUND, which is "no data", not an error.
    assert observed(utilization) == []
    gpu0.process_samples.append(sample(1, 6_000, 90))
    third = {(a["hw.name"], a["process.pid"], a["hw.gpu.task"]): v for v, a in observed(utilization)}
    assert third[("gpu0", 1, "general")] == 0.9
    assert {(n, p) for n, p, _ in third} == {("gpu0", 1)}
    assert asked == [(0, 0), (1, 0), (0, 5_000), (1, 700), (0, 5_000), (1, 700)]
    assert session.errors == {}


def test_filtered_pids_get_no_utilization_series() -> None:
    gpu = h100(0)
    gpu.process_samples = [sample(1, 10, 50), sample(2, 20, 60)]
    _, _, utilization = specs_for(FakeNvml([gpu]), ProcessAttribution(lambda pid: pid != 2))
    assert {a["process.pid"] for _, a in observed(utilization)} == {1}


def test_read_back_through_the_sdk_with_a_closed_session_reporting_nothing() -> None:
    nvml = FakeNvml([h100(0)])
    session, memory, utilization = specs_for(nvml)
    mp, reader = provider()
    register(mp.get_meter("t"), [memory, utilization], lambda: True)
    points = collect(reader)
    point = one(points, "eacgm.gpu.process.memory.usage", process__pid=4242)
    assert (point.value, point.unit) == (6 * GIB, "By")
    assert one(points, "eacgm.gpu.process.utilization", process__pid=4242, hw__gpu__task="general").value == \
        pytest.approx(0.8)
    session.close()
    assert select(collect(reader), "eacgm.gpu.process.memory.usage") == []
