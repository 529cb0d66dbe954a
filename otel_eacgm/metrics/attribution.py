"""Which processes a per-process metric reports, and the attributes each one carries.

The agent decides both: ``pid_filter`` keeps the series to the processes it traces (a GPU node
runs many that nobody asked about) and ``resource_for_pid`` adds the traced process' resource
attributes (``service.name`` ...) so a GPU-memory series joins the spans of the same process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

PidFilter = Callable[[int], bool]
ResourceForPid = Callable[[int], Mapping[str, Any] | None]

#: OTel attribute for the process id (semantic conventions, ``process.*``).
PROCESS_PID = "process.pid"


class ProcessAttribution:
    """Apply the agent's pid filter and resource lookup; with neither, every pid is reported bare."""

    def __init__(
        self,
        pid_filter: PidFilter | None = None,
        resource_for_pid: ResourceForPid | None = None,
    ) -> None:
        self._pid_filter = pid_filter
        self._resource_for_pid = resource_for_pid

    def accepts(self, pid: int) -> bool:
        """True if the agent wants series for ``pid``."""
        return self._pid_filter is None or bool(self._pid_filter(pid))

    def attributes(self, pid: int) -> dict[str, Any]:
        """``process.pid`` plus the process' resource attributes (which never override the pid)."""
        attributes: dict[str, Any] = {}
        if self._resource_for_pid is not None:
            attributes.update(self._resource_for_pid(pid) or {})
        attributes[PROCESS_PID] = pid
        return attributes
