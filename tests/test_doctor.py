"""`otel-eacgm doctor` on this machine, as root and without privileges."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

DOCTOR = [str(Path(__file__).resolve().parent.parent / ".venv/bin/otel-eacgm"), "doctor"]


@pytest.mark.ebpf
def test_doctor_passes_where_ebpf_works() -> None:
    proc = subprocess.run(DOCTOR, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
    names = [line.split("]", 1)[1].split(":", 1)[0].strip() for line in proc.stdout.splitlines() if line.startswith("[")]
    for required in ("privileges", "bpf syscall", "tracefs", "btf", "kernel headers", "bcc", "uprobe", "nvml",
                     "mapped libraries"):
        assert required in names
    links = next(ln for ln in proc.stdout.splitlines() if "] probe links:" in ln)
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    assert links.startswith("[ok") == ((major, minor) >= (6, 6)), links
    assert proc.stdout.rstrip().endswith("tracing: ready")


def test_doctor_without_privileges_fails_with_a_fix() -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to drop privileges")
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                           "--bounding-set=-all", *DOCTOR, "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    assert not checks["privileges"]["ok"] and "CAP_BPF" in checks["privileges"]["fix"]
    assert not checks["bpf syscall"]["ok"]
    assert "uprobe" not in checks  # not attempted when the basics fail


def test_agent_without_privileges_refuses_clearly() -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to drop privileges")
    agent = [DOCTOR[0], "agent"]
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                           "--bounding-set=-all", *agent], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "cannot trace as uid 65534" in proc.stderr and "otel-eacgm doctor" in proc.stderr
    assert "Traceback" not in proc.stderr
