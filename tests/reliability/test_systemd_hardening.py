"""The systemd units' hardening, as `systemd-analyze security` scores it (offline, from the
unit files): the figures recorded in README.md and docs/reliability.md must not get worse."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Exposure (0 safest .. 10): the agent must see every process and load BPF, the detector
# needs nothing.
LIMITS = {"otel-eacgm-agent.service": 5.2, "otel-eacgm-detector.service": 1.8}


def _exposure(unit: Path) -> tuple[float, str]:
    proc = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)],
                          capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout)
    if match is None:
        pytest.skip(f"systemd-analyze security --offline is not usable here: {proc.stderr.strip()[:200]}")
    return float(match.group(1)), proc.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("unit", sorted(LIMITS))
def test_unit_exposure_does_not_regress(unit: str) -> None:
    exposure, report = _exposure(REPO / "deploy/systemd" / unit)
    assert exposure <= LIMITS[unit], f"{unit}: exposure {exposure} > {LIMITS[unit]}\n{report[-3000:]}"
    if unit == "otel-eacgm-detector.service":
        for hardened in ("User=/DynamicUser=", "NoNewPrivileges=", "PrivateDevices=", "MemoryDenyWriteExecute=",
                         "CapabilityBoundingSet=~CAP_SYS_ADMIN", "SystemCallFilter=~@mount"):
            assert f"✓ {hardened}" in report, f"{unit}: {hardened} not applied"
