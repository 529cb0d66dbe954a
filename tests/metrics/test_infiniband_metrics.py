"""InfiniBand/RoCE port counters from a sysfs tree built in tmp_path."""

from __future__ import annotations

from pathlib import Path

from metrics_readback import collect, one, provider, select

from otel_eacgm.metrics.infiniband import InfinibandMetrics, read_ib_ports


def make_port(root: Path, device: str, port: int, counters: dict[str, int], hw: dict[str, int] | None = None,
              *, state: str = "4: ACTIVE", rate: str = "400 Gb/sec (4X NDR)", link_layer: str = "InfiniBand") -> None:
    base = root / "sys/class/infiniband" / device / "ports" / str(port)
    (base / "counters").mkdir(parents=True)
    (base / "state").write_text(state + "\n")
    (base / "rate").write_text(rate + "\n")
    (base / "link_layer").write_text(link_layer + "\n")
    for name, value in counters.items():
        (base / "counters" / name).write_text(f"{value}\n")
    if hw is not None:
        (base / "hw_counters").mkdir()
        for name, value in hw.items():
            (base / "hw_counters" / name).write_text(f"{value}\n")
        (base / "hw_counters" / "lifespan").write_text("10\n")


def test_ports_map_to_hw_network_metrics(tmp_path: Path) -> None:
    make_port(tmp_path, "mlx5_0", 1, {"port_xmit_data": 1000, "port_rcv_data": 250, "port_xmit_packets": 9,
                                      "port_rcv_packets": 8, "symbol_error": 2, "port_xmit_discards": 1,
                                      "link_downed": 0})
    make_port(tmp_path, "mlx5_1", 1, {"port_rcv_data": 4}, {"np_cnp_sent": 5, "out_of_sequence": 6},
              state="1: DOWN", rate="100 Gb/sec (2X HDR)", link_layer="Ethernet")
    mp, reader = provider()
    InfinibandMetrics(mp.get_meter("test"), root=str(tmp_path))
    points = collect(reader)

    tx = one(points, "hw.network.io", hw__id="mlx5_0_port1", network__io__direction="transmit")
    assert (tx.value, tx.unit) == (4000, "By")  # 4-byte words
    assert tx.attributes["hw.type"] == "network"
    assert tx.attributes["eacgm.rdma.link_layer"] == "InfiniBand"
    assert one(points, "hw.network.packets", hw__id="mlx5_0_port1", network__io__direction="receive").value == 8
    symbol = one(points, "hw.errors", error__type="symbol_error")
    assert (symbol.value, symbol.attributes["network.io.direction"]) == (2, "receive")
    assert "network.io.direction" not in one(points, "hw.errors", error__type="link_downed").attributes
    assert one(points, "hw.errors", error__type="port_xmit_discards").value == 1
    assert one(points, "hw.network.up", hw__id="mlx5_0_port1").value == 1
    assert one(points, "hw.network.up", hw__id="mlx5_1_port1").value == 0
    assert one(points, "hw.network.bandwidth.limit", hw__id="mlx5_0_port1").value == 50e9
    # A counter the driver lacks is absent, the port's others are still there.
    assert select(points, "hw.network.io", hw__id="mlx5_1_port1", network__io__direction="transmit") == []
    assert one(points, "hw.network.io", hw__id="mlx5_1_port1", network__io__direction="receive").value == 16
    hw = {p.attributes["eacgm.rdma.counter"]: p.value for p in select(points, "eacgm.rdma.hw_counter")}
    assert hw == {"np_cnp_sent": 5, "out_of_sequence": 6}  # lifespan is a setting, not a counter


def test_no_infiniband_class_means_no_ports(tmp_path: Path) -> None:
    assert read_ib_ports(str(tmp_path)) == []
