"""start_host_metrics: sources start independently; a missing GPU is one log line."""

from __future__ import annotations

import logging
from pathlib import Path

import pynvml
import pytest
from metrics_readback import collect, provider, select
from nvml_fake import FakeNvml, h100
from test_infiniband_metrics import make_port
from test_network_metrics import NET_DEV

from otel_eacgm.metrics.host import start_host_metrics


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "proc/net").mkdir(parents=True)
    (tmp_path / "proc/net/dev").write_text(NET_DEV)
    return tmp_path


def test_no_nvml_logs_one_line_and_network_still_runs(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    mp, reader = provider()
    with caplog.at_level(logging.WARNING, logger="otel_eacgm"):
        host = start_host_metrics(mp, tcp_retransmits=False, root=str(root),
                                  nvml=FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert [r.getMessage() for r in caplog.records] == ["GPU metrics off: nvmlInit failed: Driver Not Loaded"]
    assert set(host.sources) == {"network"}
    assert select(collect(reader), "system.network.io")
    host.close()


def test_all_sources_get_their_own_scope(root: Path) -> None:
    make_port(root, "mlx5_0", 1, {"symbol_error": 1})
    nvml = FakeNvml([h100(0)])
    mp, reader = provider()
    host = start_host_metrics(mp, tcp_retransmits=False, root=str(root), nvml=nvml,
                              pid_filter=lambda pid: pid == 4242, resource_for_pid=lambda pid: {"service.name": "t"})
    points = collect(reader)
    scopes = {p.name: set() for p in points}
    for p in points:
        scopes[p.name].add(p.scope)
    assert scopes["hw.errors"] == {"otel_eacgm.metrics.nvml", "otel_eacgm.metrics.infiniband"}
    assert scopes["system.network.io"] == {"otel_eacgm.metrics.network"}
    [mem] = select(points, "eacgm.gpu.process.memory.usage")
    assert (mem.attributes["process.pid"], mem.attributes["service.name"]) == (4242, "t")
    host.close()
    host.close()
    assert nvml.shutdowns == 1
    assert collect(reader) == []
