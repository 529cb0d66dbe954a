"""TCP retransmissions per process (``eacgm.tcp.retransmit.count``) from bpf/net.bpf.c.

Attribution is by socket owner, the process last seen sending on (or connecting) the socket;
see the header of bpf/net.bpf.c. Retransmits of sockets whose owner is unknown (idle since the
agent started, or kernel-owned) are reported without ``process.pid``, never under a guessed
pid. Counts of processes that have exited are reported once more and then dropped from the
kernel map, which keeps it bounded.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable

from opentelemetry.metrics import Meter, Observation

from otel_eacgm.metrics.attribution import ProcessAttribution
from otel_eacgm.metrics.instruments import Kind, ObservableSpec, register
from otel_eacgm.metrics.net_bpf import NetProgram

_LOG = logging.getLogger(__name__)

_NETWORK_TYPE = {socket.AF_INET: "ipv4", socket.AF_INET6: "ipv6"}


class TcpRetransmitMetrics:
    """Observable counters over a loaded :class:`NetProgram`; :meth:`close` unloads it."""

    def __init__(
        self,
        meter: Meter,
        program: NetProgram,
        *,
        attribution: ProcessAttribution | None = None,
        root: str = "/",
        pid_alive: Callable[[int], bool] | None = None,
    ) -> None:
        self._program = program
        self._attribution = attribution or ProcessAttribution()
        self._pid_alive = pid_alive or (lambda pid: os.path.exists(os.path.join(root, "proc", str(pid))))
        self._open = True
        register(
            meter,
            [
                ObservableSpec(
                    "eacgm.tcp.retransmit.count", Kind.COUNTER, "{retransmission}",
                    "TCP segments retransmitted, by owning process where known.", self._observe,
                ),
                ObservableSpec(
                    "eacgm.tcp.retransmit.lost", Kind.COUNTER, "{retransmission}",
                    "Retransmissions not counted because the BPF counts map was full.", self._lost,
                ),
            ],
            lambda: self._open,
        )

    def _observe(self) -> Iterable[Observation]:
        exited = []
        observations = []
        for (tgid, family), count in sorted(self._program.counts().items()):
            base = {"network.transport": "tcp", "network.type": _NETWORK_TYPE.get(family, str(family))}
            if tgid == 0:
                observations.append(Observation(count, base))
                continue
            if not self._pid_alive(tgid):
                exited.append((tgid, family))
            if self._attribution.accepts(tgid):
                observations.append(Observation(count, {**base, **self._attribution.attributes(tgid)}))
        if exited:
            self._program.forget(exited)
        return observations

    def _lost(self) -> Iterable[Observation]:
        lost = self._program.lost()
        return [Observation(lost, {})] if lost else []

    def close(self) -> None:
        """Stop observing and unload the BPF program; safe to call twice."""
        if self._open:
            self._open = False
            self._program.close()
