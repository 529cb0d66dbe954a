"""Every metric name the host sources export is documented."""

from __future__ import annotations

import re
from pathlib import Path

from metrics_readback import collect, provider
from nvml_fake import FakeNvml, h100
from test_infiniband_metrics import make_port
from test_network_metrics import NET_DEV
from test_tcp_retransmit import StubProgram

from otel_eacgm.metrics.host import start_host_metrics
from otel_eacgm.metrics.tcp_retransmit import TcpRetransmitMetrics

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_exported_name_and_attribute_is_documented(tmp_path: Path) -> None:
    (tmp_path / "proc/net").mkdir(parents=True)
    (tmp_path / "proc/net/dev").write_text(NET_DEV)
    make_port(tmp_path, "mlx5_0", 1, {"port_xmit_data": 1, "symbol_error": 1}, {"np_cnp_sent": 1})
    gpu = h100(0)
    nvml = FakeNvml([gpu])
    nvml.raise_xid(gpu, 79)
    mp, reader = provider()
    host = start_host_metrics(mp, tcp_retransmits=False, root=str(tmp_path), nvml=nvml)
    TcpRetransmitMetrics(mp.get_meter("tcp"), StubProgram({(1, 2): 1, (0, 2): 1}, lost=1))
    points = collect(reader)
    host.close()
    # The host-metrics section may live in its own file or be merged into the main one.
    text = (DOCS / "semantic-conventions.md").read_text()
    documented = set(re.findall(r"`([a-z_][\w.]*)`", text))
    names = {p.name for p in points}
    attributes = {key for p in points for key in p.attributes}
    assert sorted(names - documented) == []
    assert sorted(attributes - documented) == []
