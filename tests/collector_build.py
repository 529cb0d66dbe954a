"""The cached Collector build the tests run."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def collector_binary() -> Path:
    """The cached collector build (scripts/build-collector.sh builds it on first use)."""
    subprocess.run(["bash", str(REPO / "scripts/build-collector.sh")], check=True)
    out = subprocess.run(["bash", str(REPO / "scripts/build-collector.sh"), "--path"], check=True,
                         capture_output=True, text=True)
    return Path(out.stdout.strip())
