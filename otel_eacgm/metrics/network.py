"""Per-interface bytes, packets, errors and drops from ``/proc/net/dev`` (``system.network.*``).

``/proc/net/dev`` lists the interfaces of the reader's network namespace: run the agent in the
host namespace (``hostNetwork``) to see the host's NICs. ``root`` lets tests point at a fixture.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opentelemetry.metrics import Meter, Observation

from otel_eacgm.metrics._cache import CachedSample
from otel_eacgm.metrics.instruments import Kind, ObservableSpec, register

#: Receive columns then transmit columns, as the kernel prints them (net/core/net-procfs.c).
_RX_COLUMNS = ("bytes", "packets", "errs", "drop", "fifo", "frame", "compressed", "multicast")
_TX_COLUMNS = ("bytes", "packets", "errs", "drop", "fifo", "colls", "carrier", "compressed")


class NetDevFormatError(ValueError):
    """A ``/proc/net/dev`` line did not have the expected 16 counters."""


@dataclass(frozen=True)
class InterfaceCounters:
    """Cumulative counters of one interface, per direction."""

    rx_bytes: int
    rx_packets: int
    rx_errors: int
    rx_dropped: int
    tx_bytes: int
    tx_packets: int
    tx_errors: int
    tx_dropped: int


def parse_net_dev(text: str) -> dict[str, InterfaceCounters]:
    """Parse the text of ``/proc/net/dev`` into interface name -> counters."""
    interfaces: dict[str, InterfaceCounters] = {}
    for number, line in enumerate(text.splitlines()[2:], start=3):  # two header lines
        name, sep, rest = line.partition(":")
        if not sep:
            continue
        fields = rest.split()
        if len(fields) != len(_RX_COLUMNS) + len(_TX_COLUMNS):
            raise NetDevFormatError(
                f"/proc/net/dev line {number} ({name.strip()!r}) has {len(fields)} counters, expected 16"
            )
        rx = dict(zip(_RX_COLUMNS, map(int, fields[:8])))
        tx = dict(zip(_TX_COLUMNS, map(int, fields[8:])))
        interfaces[name.strip()] = InterfaceCounters(
            rx_bytes=rx["bytes"], rx_packets=rx["packets"], rx_errors=rx["errs"], rx_dropped=rx["drop"],
            tx_bytes=tx["bytes"], tx_packets=tx["packets"], tx_errors=tx["errs"], tx_dropped=tx["drop"],
        )
    return interfaces


def read_interface_counters(root: str = "/") -> dict[str, InterfaceCounters]:
    """Counters of every interface in ``<root>/proc/net/dev``."""
    with open(os.path.join(root, "proc/net/dev"), encoding="ascii") as f:
        return parse_net_dev(f.read())


#: (instrument, unit, description, receive field, transmit field)
_CATALOG = (
    ("system.network.io", "By", "Bytes received and transmitted by the interface.", "rx_bytes", "tx_bytes"),
    ("system.network.packet.count", "{packet}", "Packets received and transmitted.", "rx_packets", "tx_packets"),
    ("system.network.errors", "{error}", "Receive and transmit errors (the errs column).", "rx_errors", "tx_errors"),
    ("system.network.packet.dropped", "{packet}", "Packets dropped without an error (the drop column).",
     "rx_dropped", "tx_dropped"),
)


class NetworkMetrics:
    """The ``system.network.*`` counters; one ``/proc/net/dev`` read serves all four per collection."""

    def __init__(self, meter: Meter, *, root: str = "/") -> None:
        self._sample = CachedSample(lambda: read_interface_counters(root))
        self._open = True
        specs = [
            ObservableSpec(name, Kind.COUNTER, unit, description, self._observer(rx, tx))
            for name, unit, description, rx, tx in _CATALOG
        ]
        register(meter, specs, lambda: self._open)

    def _observer(self, rx_field: str, tx_field: str) -> Callable[[], Iterable[Observation]]:
        def observe() -> Iterable[Observation]:
            for name, counters in sorted(self._sample.get(rx_field).items()):
                for direction, field in (("receive", rx_field), ("transmit", tx_field)):
                    yield Observation(
                        getattr(counters, field),
                        {"network.interface.name": name, "network.io.direction": direction},
                    )

        return observe

    def close(self) -> None:
        """Stop observing."""
        self._open = False
