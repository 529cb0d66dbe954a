"""InfiniBand / RoCE port counters from ``/sys/class/infiniband`` under ``hw.network.*`` names.

Each RDMA port is a network adapter in the ``hw.*`` conventions (``hw.type=network``). Reads
are per file: a driver that lacks a counter loses that series only. Hosts without RDMA devices
have no ``/sys/class/infiniband`` and report nothing.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from opentelemetry.metrics import Meter, Observation

from otel_eacgm.metrics._cache import CachedSample
from otel_eacgm.metrics.instruments import Kind, ObservableSpec, register

_LOG = logging.getLogger(__name__)

#: port_xmit_data / port_rcv_data count 4-byte words (IBA PortCounters), not bytes.
_DATA_WORD_BYTES = 4

#: Error counters (file under counters/) -> network.io.direction, or None where it has none.
ERROR_COUNTERS: dict[str, str | None] = {
    "symbol_error": "receive",
    "port_rcv_errors": "receive",
    "port_rcv_remote_physical_errors": "receive",
    "port_rcv_switch_relay_errors": "receive",
    "port_rcv_constraint_errors": "receive",
    "port_xmit_constraint_errors": "transmit",
    "port_xmit_discards": "transmit",
    "local_link_integrity_errors": None,
    "excessive_buffer_overrun_errors": "receive",
    "link_error_recovery": None,
    "link_downed": None,
    "VL15_dropped": "receive",
}

#: hw_counters files that are not event counters.
_NOT_COUNTERS = frozenset({"lifespan"})

_RATE = re.compile(r"^\s*([\d.]+)\s*Gb/sec")


@dataclass(frozen=True)
class IbPort:
    """One RDMA port's identity and the counters its driver exposes."""

    device: str
    port: int
    link_layer: str | None
    active: bool | None
    rate_bytes_per_s: float | None
    counters: dict[str, int] = field(default_factory=dict)
    hw_counters: dict[str, int] = field(default_factory=dict)

    @property
    def hw_id(self) -> str:
        """Host-unique id of the port."""
        return f"{self.device}_port{self.port}"


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError as exc:
        _LOG.debug("cannot read %s: %s", path, exc)
        return None


def _read_counters(directory: str, skip: frozenset[str] = frozenset()) -> dict[str, int]:
    values: dict[str, int] = {}
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return values
    for name in names:
        if name in skip:
            continue
        text = _read_text(os.path.join(directory, name))
        if text is None:
            continue
        try:
            values[name] = int(text)
        except ValueError:
            _LOG.debug("%s/%s is not an integer counter: %r", directory, name, text)
    return values


def read_ib_ports(root: str = "/") -> list[IbPort]:
    """Every port of every device under ``<root>/sys/class/infiniband``."""
    base = os.path.join(root, "sys/class/infiniband")
    try:
        devices = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    ports: list[IbPort] = []
    for device in devices:
        ports_dir = os.path.join(base, device, "ports")
        try:
            port_names = sorted(os.listdir(ports_dir), key=lambda p: (len(p), p))
        except OSError as exc:
            _LOG.debug("cannot list %s: %s", ports_dir, exc)
            continue
        for port_name in port_names:
            if not port_name.isdigit():
                continue
            port_dir = os.path.join(ports_dir, port_name)
            state = _read_text(os.path.join(port_dir, "state"))  # e.g. "4: ACTIVE"
            rate = _RATE.match(_read_text(os.path.join(port_dir, "rate")) or "")  # "400 Gb/sec (4X NDR)"
            ports.append(
                IbPort(
                    device=device,
                    port=int(port_name),
                    link_layer=_read_text(os.path.join(port_dir, "link_layer")),
                    active=None if state is None else state.endswith("ACTIVE"),
                    rate_bytes_per_s=float(rate.group(1)) * 1e9 / 8 if rate else None,
                    counters=_read_counters(os.path.join(port_dir, "counters")),
                    hw_counters=_read_counters(os.path.join(port_dir, "hw_counters"), _NOT_COUNTERS),
                )
            )
    return ports


def _attributes(port: IbPort) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {
        "hw.type": "network",
        "hw.id": port.hw_id,
        "hw.name": f"{port.device} port {port.port}",
        "eacgm.rdma.device": port.device,
        "eacgm.rdma.port": port.port,
    }
    if port.link_layer:
        attributes["eacgm.rdma.link_layer"] = port.link_layer  # InfiniBand or Ethernet (RoCE)
    return attributes


def _directional(port: IbPort, rx: str, tx: str, scale: int = 1) -> Iterable[tuple[int, dict[str, str]]]:
    for counter, direction in ((rx, "receive"), (tx, "transmit")):
        if counter in port.counters:
            yield port.counters[counter] * scale, {"network.io.direction": direction}


class InfinibandMetrics:
    """``hw.network.*`` / ``hw.errors`` per RDMA port; one sysfs walk serves all per collection."""

    def __init__(self, meter: Meter, *, root: str = "/") -> None:
        self._sample = CachedSample(lambda: read_ib_ports(root))
        self._open = True
        specs = [
            ObservableSpec("hw.network.io", Kind.COUNTER, "By", "Bytes received and transmitted by the port.",
                           self._each(lambda p: _directional(p, "port_rcv_data", "port_xmit_data", _DATA_WORD_BYTES))),
            ObservableSpec("hw.network.packets", Kind.COUNTER, "{packet}", "Packets received and transmitted.",
                           self._each(lambda p: _directional(p, "port_rcv_packets", "port_xmit_packets"))),
            ObservableSpec("hw.errors", Kind.COUNTER, "{error}", "Port error counters; error.type is the counter.",
                           self._each(self._errors)),
            ObservableSpec("hw.network.up", Kind.UP_DOWN_COUNTER, "1", "1 while the port state is ACTIVE.",
                           self._each(lambda p: [] if p.active is None else [(int(p.active), {})])),
            ObservableSpec("hw.network.bandwidth.limit", Kind.UP_DOWN_COUNTER, "By/s", "Link rate of the port.",
                           self._each(lambda p: [] if p.rate_bytes_per_s is None else [(p.rate_bytes_per_s, {})])),
            ObservableSpec("eacgm.rdma.hw_counter", Kind.COUNTER, "{event}",
                           "Driver hw_counters (RoCE congestion, retransmission...), by eacgm.rdma.counter.",
                           self._each(lambda p: [(v, {"eacgm.rdma.counter": k}) for k, v in p.hw_counters.items()])),
        ]
        register(meter, specs, lambda: self._open)

    @staticmethod
    def _errors(port: IbPort) -> Iterable[tuple[int, dict[str, str]]]:
        for counter, direction in ERROR_COUNTERS.items():
            if counter in port.counters:
                extra = {"error.type": counter}
                if direction is not None:
                    extra["network.io.direction"] = direction
                yield port.counters[counter], extra

    def _each(
        self, read: Callable[[IbPort], Iterable[tuple[float, dict[str, str]]]]
    ) -> Callable[[], Iterable[Observation]]:
        def observe() -> Iterable[Observation]:
            for port in self._sample.get(read):
                base = _attributes(port)
                for value, extra in read(port):
                    yield Observation(value, {**base, **extra})

        return observe

    def close(self) -> None:
        """Stop observing."""
        self._open = False
