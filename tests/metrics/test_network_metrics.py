"""Interface counters: the /proc/net/dev parser, and real loopback traffic read back as deltas."""

from __future__ import annotations

import socket
import threading

import pytest
from metrics_readback import collect, one, provider

from otel_eacgm.metrics.network import NetDevFormatError, NetworkMetrics, parse_net_dev, read_interface_counters

NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:   12772     116    0    0    0     0          0         0    12772     116    0    0    0     0       0          0
  eth0: 614004770   21186    3    4    0     0          0         0  1337514   13164    5    6    0     0       0          0
"""


def test_parse_net_dev_reads_the_four_counters_per_direction() -> None:
    eth0 = parse_net_dev(NET_DEV)["eth0"]
    assert (eth0.rx_bytes, eth0.rx_packets, eth0.rx_errors, eth0.rx_dropped) == (614004770, 21186, 3, 4)
    assert (eth0.tx_bytes, eth0.tx_packets, eth0.tx_errors, eth0.tx_dropped) == (1337514, 13164, 5, 6)


def test_a_short_line_names_the_interface() -> None:
    with pytest.raises(NetDevFormatError, match=r"\('eth0'\) has 3 counters, expected 16"):
        parse_net_dev("h1\nh2\n  eth0: 1 2 3\n")


def test_instruments_use_system_network_names_from_a_fixture_root(tmp_path) -> None:
    (tmp_path / "proc/net").mkdir(parents=True)
    (tmp_path / "proc/net/dev").write_text(NET_DEV)
    mp, reader = provider()
    NetworkMetrics(mp.get_meter("test"), root=str(tmp_path))
    points = collect(reader)
    rx = one(points, "system.network.io", network__interface__name="eth0", network__io__direction="receive")
    assert (rx.value, rx.unit) == (614004770, "By")
    assert one(points, "system.network.packet.count", network__interface__name="eth0",
               network__io__direction="transmit").value == 13164
    assert one(points, "system.network.errors", network__interface__name="eth0",
               network__io__direction="transmit").value == 5
    assert one(points, "system.network.packet.dropped", network__interface__name="eth0",
               network__io__direction="receive").value == 4


def _send_over_loopback(payload: int) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    received = bytearray()

    def drain() -> None:
        conn, _ = server.accept()
        with conn:
            while chunk := conn.recv(65536):
                received.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    with socket.create_connection(server.getsockname()) as client:
        client.sendall(b"\0" * payload)
    reader.join(timeout=10)
    server.close()
    assert len(received) == payload


def test_real_loopback_traffic_shows_up_as_deltas() -> None:
    payload = 8 * 2**20
    mp, reader = provider()
    NetworkMetrics(mp.get_meter("test"))
    before = collect(reader)
    _send_over_loopback(payload)
    after = collect(reader)

    def delta(name: str, direction: str) -> float:
        attrs = {"network__interface__name": "lo", "network__io__direction": direction}
        return one(after, name, **attrs).value - one(before, name, **attrs).value

    # Other processes may use loopback too, so the deltas are lower bounds.
    assert delta("system.network.io", "transmit") >= payload
    assert delta("system.network.io", "receive") >= payload
    assert delta("system.network.packet.count", "transmit") >= payload // 65536
    assert read_interface_counters()["lo"].tx_bytes >= one(after, "system.network.io", network__interface__name="lo",
                                                            network__io__direction="transmit").value
