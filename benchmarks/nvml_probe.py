"""Record what the GPU metrics really export on a GPU machine.

Starts only the GPU source of the host metrics on the real pynvml, collects through an OTel SDK
InMemoryMetricReader at the start and again after ``--seconds`` (energy, XID and utilization
samples need time), and prints every data point as a table: metric, unit, value and the
attributes beyond the per-device ones (which are printed once per GPU). Exits 1 if NVML is
unavailable, so a GPU run cannot silently pass without GPU data.

    .venv/bin/python benchmarks/nvml_probe.py --seconds 5 > nvml_probe.txt
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_eacgm.metrics.host import start_host_metrics

#: Printed once per GPU instead of on every row.
DEVICE_KEYS = ("hw.id", "hw.name", "hw.type", "hw.vendor", "hw.model", "hw.serial_number",
               "hw.firmware_version", "hw.driver_version", "eacgm.gpu.index", "eacgm.gpu.pci.bus_id")


def points(reader: InMemoryMetricReader) -> list[tuple[str, str, dict, float]]:
    """(name, unit, attributes, value) of every point in one collection."""
    data = reader.get_metrics_data()
    out = []
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for dp in metric.data.data_points:
                    out.append((metric.name, metric.unit, dict(dp.attributes), dp.value))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Collect twice and print the second collection (plus what changed in between)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="time between the two collections")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    host = start_host_metrics(provider, network=False, tcp_retransmits=False)
    if "gpu" not in host.sources:
        print("NVML unavailable: no GPU metrics (see the log line above)", file=sys.stderr)
        return 1
    first = {(n, tuple(sorted(a.items()))): v for n, _, a, v in points(reader)}
    time.sleep(args.seconds)
    second = points(reader)
    host.close()

    devices = {}
    for _, _, attributes, _ in second:
        if attributes.get("hw.type") == "gpu":
            devices[attributes["hw.id"]] = {k: attributes[k] for k in DEVICE_KEYS if k in attributes}
    print("## GPUs")
    for attributes in devices.values():
        print("  " + ", ".join(f"{k}={v}" for k, v in attributes.items()))
    print(f"\n## Data points ({len(second)}), second collection, {args.seconds:g} s after the first")
    print(f"{'metric':<42} {'unit':<16} {'value':>18} {'delta':>14}  attributes")
    for name, unit, attributes, value in sorted(second, key=lambda p: (p[0], sorted(p[2].items()))):
        extra = {k: v for k, v in attributes.items() if k not in DEVICE_KEYS or k == "hw.name"}
        earlier = first.get((name, tuple(sorted(attributes.items()))))
        delta = "" if earlier is None else f"{value - earlier:+.6g}"
        print(f"{name:<42} {unit:<16} {value:>18.6g} {delta:>14}  " + ", ".join(f"{k}={v}" for k, v in extra.items()))
    names = sorted({p[0] for p in second})
    print(f"\n## {len(names)} metric names: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
