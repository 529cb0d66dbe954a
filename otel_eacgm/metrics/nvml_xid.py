"""Counts of NVML XID critical-error events per GPU and XID code.

XIDs are events, not counters: NVML queues them on an event set and we drain the queue without
waiting at each collection. Counts start at zero when the agent starts; an XID raised before
that is not seen (``nvidia-smi -q`` / the kernel log hold the history).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

from otel_eacgm.metrics.nvml_session import GpuDevice, NvmlSession

_LOG = logging.getLogger(__name__)

#: Upper bound on events drained per collection, so an XID storm cannot stall the exporter.
MAX_EVENTS_PER_DRAIN = 1024


class XidWatcher:
    """An NVML event set registered for XID critical errors on every GPU that supports it."""

    def __init__(self, session: NvmlSession, event_set: Any) -> None:
        self._session = session
        self._event_set = event_set
        self._lock = threading.Lock()
        self._counts: dict[int, Counter[int]] = {d.index: Counter() for d in session.devices}
        self._closed = False

    @classmethod
    def start(cls, session: NvmlSession) -> XidWatcher | None:
        """Register XID events on each GPU; None (logged) where no GPU supports them."""
        nvml = session.nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            _LOG.info("XID events unavailable: nvmlEventSetCreate failed: %s", exc)
            return None
        registered = 0
        for device in session.devices:
            try:
                nvml.nvmlDeviceRegisterEvents(device.handle, nvml.nvmlEventTypeXidCriticalError, event_set)
                registered += 1
            except nvml.NVMLError as exc:
                _LOG.info("GPU %d: XID events not registered: %s", device.index, exc)
        if registered == 0:
            nvml.nvmlEventSetFree(event_set)
            return None
        return cls(session, event_set)

    def _drain(self) -> None:
        nvml = self._session.nvml
        for _ in range(MAX_EVENTS_PER_DRAIN):
            try:
                event = nvml.nvmlEventSetWait_v2(self._event_set, 0)
            except nvml.NVMLError_Timeout:
                return
            except nvml.NVMLError as exc:
                _LOG.warning("nvmlEventSetWait_v2 failed: %s; XID counts may lag", exc)
                return
            try:
                index = nvml.nvmlDeviceGetIndex(event.device)
            except nvml.NVMLError as exc:
                _LOG.warning("XID %d on an unidentifiable GPU (%s)", event.eventData, exc)
                continue
            self._counts.setdefault(index, Counter())[int(event.eventData)] += 1

    def counts(self, device: GpuDevice) -> dict[int, int]:
        """XID code -> events seen on ``device`` since the agent started."""
        with self._lock:
            if self._closed:
                return {}
            self._drain()
            return dict(self._counts.get(device.index, {}))

    def close(self) -> None:
        """Free the event set (before NVML is shut down); safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            nvml = self._session.nvml
            try:
                nvml.nvmlEventSetFree(self._event_set)
            except nvml.NVMLError as exc:
                _LOG.warning("nvmlEventSetFree failed: %s", exc)
