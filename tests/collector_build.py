"""The cached Collector, Jaeger, VictoriaLogs and Zipkin the tests run."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _cached(script: str) -> Path:
    """Build on first use with scripts/SCRIPT (cached under ~/.cache/otel-eacgm), return the binary."""
    subprocess.run(["bash", str(REPO / "scripts" / script)], check=True)
    out = subprocess.run(["bash", str(REPO / "scripts" / script), "--path"], check=True,
                         capture_output=True, text=True)
    return Path(out.stdout.strip())


def collector_binary() -> Path:
    """The cached collector build (scripts/build-collector.sh)."""
    return _cached("build-collector.sh")


def jaeger_binary() -> Path:
    """The cached Jaeger v1.75.0 build (scripts/build-jaeger.sh)."""
    return _cached("build-jaeger.sh")


def victorialogs_binary() -> Path:
    """The cached VictoriaLogs v1.52.2 build (scripts/build-victorialogs.sh)."""
    return _cached("build-victorialogs.sh")


def zipkin_jar() -> Path:
    """The cached Zipkin 3.5.1 server jar from Maven Central (scripts/fetch-zipkin.sh)."""
    return _cached("fetch-zipkin.sh")
