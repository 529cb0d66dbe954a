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


def test_doctor_names_each_running_interpreter_whose_frames_it_cannot_read() -> None:
    """A CPython the frame walk does not know (pyenv's 3.9) runs beside one it reads through
    _Py_DebugOffsets (3.13): doctor's process check fails on the first, names why, and passes
    the second; the agent's own interpreter is read from the table."""
    pyenv = Path("/root/.pyenv/versions")
    old, new = pyenv / "3.9.18/bin/python3.9", pyenv / "3.13.0/bin/python3.13"
    if not (old.exists() and new.exists()):
        pytest.skip("needs pyenv's CPython 3.9 and 3.13")
    sleepers = [subprocess.Popen([str(p), "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
                for p in (old, new)]
    try:
        proc = subprocess.run([*DOCTOR, "--json"], capture_output=True, text=True, timeout=120)
    finally:
        for p in sleepers:
            p.communicate(b"", timeout=10)
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    running = checks["python frames of processes"]
    notes = dict(part.split(": ", 1) for part in running["detail"].split("; "))
    assert not running["ok"] and "their other layers are traced" in running["fix"]
    assert notes[str(pyenv / "3.9.18/lib/libpython3.9.so.1.0")] == (
        "CPython 3.9 has no _Py_DebugOffsets and is not in the agent's table (3.10-3.12)")
    assert notes[str(pyenv / "3.13.0/lib/libpython3.13.so.1.0")] == "CPython 3.13 frames read (layout from debug offsets)"
    own = checks["python frames"]
    assert own["ok"] and own["detail"].endswith("CPython 3.11 frames read (layout from table)"), own
