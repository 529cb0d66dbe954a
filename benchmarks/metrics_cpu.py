"""CPU and memory cost of the host metrics, at 1 s and 10 s export intervals.

Each interval runs in a fresh child process: host metrics with everything on (GPU where NVML
works, network + InfiniBand, TCP retransmits via BPF where it loads), a real
PeriodicExportingMetricReader, and an exporter that counts the points and drops them. The
child reports CPU seconds spent after start-up (BCC's compile is reported apart) per minute of
wall time, its RSS at the end and at peak. Run as root for the BPF part:

    sudo .venv/bin/python benchmarks/metrics_cpu.py --seconds 60
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import time
from collections.abc import Sequence

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)


class CountingExporter(MetricExporter):
    """Counts exported points and drops them: an exporter to nowhere with a receipt."""

    def __init__(self) -> None:
        super().__init__()
        self.exports = 0
        self.points = 0

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object) -> MetricExportResult:
        self.exports += 1
        self.points += sum(
            len(m.data.data_points) for rm in metrics_data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
        )
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        return None


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def child(interval_s: float, seconds: float) -> dict[str, object]:
    """Run the host metrics for ``seconds`` at ``interval_s``; return the measurements."""
    from otel_eacgm.metrics.host import start_host_metrics  # noqa: PLC0415 - child-only import

    exporter = CountingExporter()
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=interval_s * 1000)
    provider = MeterProvider(metric_readers=[reader])
    cpu0 = time.process_time()
    host = start_host_metrics(provider)
    startup_cpu = time.process_time() - cpu0
    sources = sorted(host.sources)
    wall0, cpu1 = time.monotonic(), time.process_time()
    time.sleep(seconds)
    wall, cpu = time.monotonic() - wall0, time.process_time() - cpu1
    rss = _rss_kib()
    host.close()
    provider.shutdown()
    return {
        "interval_s": interval_s,
        "sources": sources,
        "startup_cpu_s": round(startup_cpu, 3),
        "cpu_s_per_min": round(cpu / wall * 60, 4),
        "rss_mib": round(rss / 1024, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "exports": exporter.exports,
        "points_per_export": round(exporter.points / max(exporter.exports, 1)),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run one child per interval and print their figures side by side."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measured run per interval (default 60)")
    parser.add_argument("--intervals", type=float, nargs="+", default=[1.0, 10.0], help="export intervals, s")
    parser.add_argument("--child", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        print(json.dumps(child(args.child, args.seconds)))
        return 0
    results = []
    for interval in args.intervals:
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(interval), "--seconds", str(args.seconds)],
            check=True, capture_output=True, text=True,
        )
        sys.stderr.write(out.stderr)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = [
        ("export interval (s)", "interval_s"),
        ("sources", "sources"),
        ("start-up CPU (s)", "startup_cpu_s"),
        ("CPU s per minute", "cpu_s_per_min"),
        ("RSS at end (MiB)", "rss_mib"),
        ("peak RSS (MiB)", "peak_rss_mib"),
        ("exports", "exports"),
        ("points per export", "points_per_export"),
    ]
    print(f"host metrics, {args.seconds:g} s measured per interval")
    for label, key in rows:
        cells = [",".join(r[key]) if isinstance(r[key], list) else str(r[key]) for r in results]
        print(f"{label:<22}" + "".join(f"{c:>26}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
