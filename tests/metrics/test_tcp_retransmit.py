"""TCP retransmits per process: mapping over a stand-in program, then real retransmissions."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from metrics_ebpf_env import skip_or_fail
from metrics_readback import collect, one, provider, select

from otel_eacgm.metrics.attribution import ProcessAttribution
from otel_eacgm.metrics.tcp_retransmit import TcpRetransmitMetrics

PEER = Path(__file__).with_name("lossy_peer.py")


class StubProgram:
    """Stands in for NetProgram's map reads (the BPF side is tested for real below)."""

    def __init__(self, counts: dict[tuple[int, int], int], lost: int = 0) -> None:
        self._counts = dict(counts)
        self._lost = lost
        self.forgotten: list[tuple[int, int]] = []
        self.closed = 0

    def counts(self) -> dict[tuple[int, int], int]:
        return dict(self._counts)

    def forget(self, keys) -> None:
        for key in keys:
            self.forgotten.append(key)
            self._counts.pop(key, None)

    def lost(self) -> int:
        return self._lost

    def close(self) -> None:
        self.closed += 1


def test_owner_unattributed_exited_and_filtered_series() -> None:
    program = StubProgram({(0, socket.AF_INET): 3, (100, socket.AF_INET6): 5, (200, socket.AF_INET): 7,
                           (300, socket.AF_INET): 1}, lost=2)
    mp, reader = provider()
    metrics = TcpRetransmitMetrics(
        mp.get_meter("test"), program,
        attribution=ProcessAttribution(lambda pid: pid != 300, lambda pid: {"service.name": "svc"}),
        pid_alive=lambda pid: pid != 200,
    )
    points = collect(reader)
    unattributed = [p for p in select(points, "eacgm.tcp.retransmit.count") if "process.pid" not in p.attributes]
    assert [(p.value, p.attributes) for p in unattributed] == [(3, {"network.transport": "tcp", "network.type": "ipv4"})]
    p100 = one(points, "eacgm.tcp.retransmit.count", process__pid=100)
    assert (p100.value, p100.attributes["network.type"], p100.attributes["service.name"]) == (5, "ipv6", "svc")
    assert one(points, "eacgm.tcp.retransmit.count", process__pid=200).value == 7  # reported once more...
    assert select(points, "eacgm.tcp.retransmit.count", process__pid=300) == []  # filtered out
    assert one(points, "eacgm.tcp.retransmit.lost").value == 2
    assert program.forgotten == [(200, socket.AF_INET)]  # ...then dropped from the map
    metrics.close()
    metrics.close()
    assert program.closed == 1


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.mark.ebpf
def test_real_retransmissions_are_counted_for_the_sending_pid(ebpf_ready: None) -> None:
    from otel_eacgm.bpf_program import BpfError
    from otel_eacgm.metrics.net_bpf import NetProgram

    try:
        program = NetProgram()
    except BpfError as exc:
        skip_or_fail(f"net.bpf.c does not load here: {exc}")
    namespace = f"eacgm-rtx-{os.getpid()}"
    try:
        _ip("netns", "add", namespace)
    except subprocess.CalledProcessError as exc:
        program.close()
        skip_or_fail(f"cannot create a network namespace: {exc.stderr.strip()}")
    mp, reader = provider()
    metrics = TcpRetransmitMetrics(mp.get_meter("test"), program)
    peer = None
    try:
        # A private loopback keeps the induced loss away from everything else on this host.
        _ip("netns", "exec", namespace, "ip", "link", "set", "lo", "up")
        peer = subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, str(PEER), "2.5"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        pid, status = peer.stdout.readline().split()
        assert status == "ready"
        # Taking loopback down makes every transmission fail, so the kernel retransmits on
        # each RTO (tc netem and iptables are not available in this kernel/container).
        _ip("netns", "exec", namespace, "ip", "link", "set", "lo", "down")
        peer.stdin.write("send\n")
        peer.stdin.flush()
        assert peer.stdout.readline().strip() == "done"
        points = collect(reader)
    finally:
        if peer is not None:
            peer.kill()
            peer.wait()
        subprocess.run(["ip", "netns", "del", namespace], check=False)
        metrics.close()
    sender = one(points, "eacgm.tcp.retransmit.count", process__pid=int(pid))
    assert sender.value > 0
    assert sender.attributes["network.type"] == "ipv4"
