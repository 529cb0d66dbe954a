"""XID critical-error counting from NVML events, against the pynvml stand-in."""

from __future__ import annotations

import logging

import pynvml
import pytest
from nvml_fake import FakeNvml, consumer_gpu, h100, nvml_error

from otel_eacgm.metrics.nvml_session import GpuDevice, NvmlSession
from otel_eacgm.metrics.nvml_xid import MAX_EVENTS_PER_DRAIN, XidWatcher


def open_session(*gpus) -> tuple[FakeNvml, NvmlSession]:  # noqa: ANN002
    nvml = FakeNvml(list(gpus))
    return nvml, NvmlSession.open(nvml)


def test_counts_are_per_gpu_and_per_code_and_accumulate_across_collections() -> None:
    nvml, session = open_session(h100(0), h100(1))
    watcher = XidWatcher.start(session)
    assert watcher is not None
    gpu0, gpu1 = session.devices
    assert watcher.counts(gpu0) == {} and watcher.counts(gpu1) == {}
    for code in (79, 79, 48):
        nvml.raise_xid(nvml.gpus[1], code)
    nvml.raise_xid(nvml.gpus[0], 13)
    assert watcher.counts(gpu1) == {79: 2, 48: 1}
    assert watcher.counts(gpu0) == {13: 1}  # drained by the gpu1 call, kept for gpu0
    nvml.raise_xid(nvml.gpus[1], 79)
    assert watcher.counts(gpu1) == {79: 3, 48: 1}
    assert len(nvml.events) == 0


def test_counts_returned_are_a_copy() -> None:
    nvml, session = open_session(h100(0))
    watcher = XidWatcher.start(session)
    nvml.raise_xid(nvml.gpus[0], 31)
    got = watcher.counts(session.devices[0])
    got[31] = 1000
    assert watcher.counts(session.devices[0]) == {31: 1}


def test_no_watcher_when_no_gpu_supports_xid_events_and_the_event_set_is_freed(caplog) -> None:  # noqa: ANN001
    nvml, session = open_session(consumer_gpu(0), consumer_gpu(1))
    with caplog.at_level(logging.INFO, logger="otel_eacgm.metrics.nvml_xid"):
        assert XidWatcher.start(session) is None
    assert nvml.freed_event_sets == 1
    assert [r.getMessage() for r in caplog.records] == [
        "GPU 0: XID events not registered: Not Supported",
        "GPU 1: XID events not registered: Not Supported",
    ]


def test_a_gpu_without_xid_support_does_not_stop_the_others() -> None:
    nvml, session = open_session(consumer_gpu(0), h100(1))
    watcher = XidWatcher.start(session)
    assert watcher is not None
    assert nvml.freed_event_sets == 0
    nvml.raise_xid(nvml.gpus[1], 94)
    assert watcher.counts(session.devices[1]) == {94: 1}
    assert watcher.counts(session.devices[0]) == {}


def test_no_watcher_when_the_event_set_cannot_be_created(monkeypatch: pytest.MonkeyPatch, caplog) -> None:  # noqa: ANN001
    nvml, session = open_session(h100(0))

    def fail() -> None:
        raise nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)

    monkeypatch.setattr(nvml, "nvmlEventSetCreate", fail)
    with caplog.at_level(logging.INFO, logger="otel_eacgm.metrics.nvml_xid"):
        assert XidWatcher.start(session) is None
    assert caplog.records[0].getMessage() == "XID events unavailable: nvmlEventSetCreate failed: Insufficient Permissions"
    assert nvml.freed_event_sets == 0


def test_one_collection_drains_at_most_the_bound_and_the_rest_next_time() -> None:
    nvml, session = open_session(h100(0))
    watcher = XidWatcher.start(session)
    for _ in range(MAX_EVENTS_PER_DRAIN + 10):
        nvml.raise_xid(nvml.gpus[0], 63)
    assert watcher.counts(session.devices[0]) == {63: MAX_EVENTS_PER_DRAIN}
    assert len(nvml.events) == 10
    assert watcher.counts(session.devices[0]) == {63: MAX_EVENTS_PER_DRAIN + 10}


def test_an_event_of_an_unidentifiable_gpu_is_skipped_and_logged(monkeypatch: pytest.MonkeyPatch, caplog) -> None:  # noqa: ANN001
    nvml, session = open_session(h100(0))
    watcher = XidWatcher.start(session)
    lost = h100(5)
    real = nvml.nvmlDeviceGetIndex

    def index(handle):  # noqa: ANN001, ANN202
        if handle is lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return real(handle)

    monkeypatch.setattr(nvml, "nvmlDeviceGetIndex", index)
    nvml.raise_xid(lost, 79)
    nvml.raise_xid(nvml.gpus[0], 13)
    with caplog.at_level(logging.WARNING, logger="otel_eacgm.metrics.nvml_xid"):
        assert watcher.counts(session.devices[0]) == {13: 1}
    assert [r.getMessage() for r in caplog.records] == ["XID 79 on an unidentifiable GPU (GPU is lost)"]


def test_an_event_of_a_gpu_the_session_did_not_open_is_kept_under_its_index() -> None:
    nvml, session = open_session(h100(0))
    watcher = XidWatcher.start(session)
    other = h100(3)
    nvml.raise_xid(other, 45)
    nvml.raise_xid(nvml.gpus[0], 45)
    assert watcher.counts(session.devices[0]) == {45: 1}
    assert watcher.counts(GpuDevice(index=3, handle=other, hw_id="gpu3")) == {45: 1}


def test_a_failing_wait_stops_the_drain_and_later_collections_catch_up(monkeypatch: pytest.MonkeyPatch,
                                                                        caplog) -> None:  # noqa: ANN001
    nvml, session = open_session(h100(0))
    watcher = XidWatcher.start(session)
    nvml.raise_xid(nvml.gpus[0], 13)
    real = nvml.nvmlEventSetWait_v2

    def fail(event_set, timeout_ms):  # noqa: ANN001, ANN202
        raise nvml_error(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(nvml, "nvmlEventSetWait_v2", fail)
    with caplog.at_level(logging.WARNING, logger="otel_eacgm.metrics.nvml_xid"):
        assert watcher.counts(session.devices[0]) == {}
    assert "nvmlEventSetWait_v2 failed: Unknown Error; XID counts may lag" in caplog.text
    monkeypatch.setattr(nvml, "nvmlEventSetWait_v2", real)
    assert watcher.counts(session.devices[0]) == {13: 1}


def test_the_wait_never_blocks() -> None:
    nvml, session = open_session(h100(0))
    watcher = XidWatcher.start(session)
    timeouts = []
    real = nvml.nvmlEventSetWait_v2

    def wait(event_set, timeout_ms):  # noqa: ANN001, ANN202
        timeouts.append(timeout_ms)
        return real(event_set, timeout_ms)

    nvml.nvmlEventSetWait_v2 = wait
    nvml.raise_xid(nvml.gpus[0], 13)
    watcher.counts(session.devices[0])
    assert timeouts == [0, 0]  # one event, then the empty queue's timeout


def test_close_frees_the_event_set_once_and_counts_nothing_after() -> None:
    nvml, session = open_session(h100(0))
    watcher = XidWatcher.start(session)
    nvml.raise_xid(nvml.gpus[0], 13)
    watcher.close()
    watcher.close()
    assert nvml.freed_event_sets == 1
    assert watcher.counts(session.devices[0]) == {}
    assert len(nvml.events) == 1  # not drained after close


def test_a_failing_free_is_logged_not_raised(monkeypatch: pytest.MonkeyPatch, caplog) -> None:  # noqa: ANN001
    nvml, session = open_session(h100(0))
    watcher = XidWatcher.start(session)

    def fail(event_set) -> None:  # noqa: ANN001
        raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)

    monkeypatch.setattr(nvml, "nvmlEventSetFree", fail)
    with caplog.at_level(logging.WARNING, logger="otel_eacgm.metrics.nvml_xid"):
        watcher.close()
    assert [r.getMessage() for r in caplog.records] == ["nvmlEventSetFree failed: Uninitialized"]
