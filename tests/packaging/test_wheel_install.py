"""The wheel as a user gets it: built from the checkout, installed with its dependencies into a
clean virtualenv, and run from there against the real libcudart and libnccl.

BCC compiles bpf/calls.bpf.c and every header it includes on the traced host, when the agent
starts. A wheel that lacks one of them installs and imports fine and fails only then, so this
test looks inside the wheel and also runs the installed agent, from outside the checkout.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from agent_run import summary

REPO = Path(__file__).resolve().parents[2]
# Debian's interpreter: its python3-bpfcc is the only `bcc` (scripts/setup.sh builds .venv on it too).
SYSTEM_PYTHON = "/usr/bin/python3.11"
BPF_PACKAGE = PurePosixPath("otel_eacgm/bpf")
UNITS = ("calls.bpf.c", "net.bpf.c")  # what otel_eacgm/bpf_program.py and metrics/net_bpf.py compile
WORKLOAD = REPO / "tests/workloads/cuda_nccl_calls.py"
PLAN = [["cudaMalloc", 2], ["cudaMemcpy", 1], ["cudaLaunchKernel", 3], ["ncclAllReduce", 2],
        ["ncclGroupStart", 1], ["ncclGroupEnd", 1]]


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment minus anything that would make the checkout or another venv importable."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PYTHONNOUSERSITE="1", **extra)
    return env


def _checkout_copy(dest: Path) -> Path:
    """The checkout's files (tracked, and new ones git does not ignore) copied to `dest`.

    Not built in place: setuptools reuses ./build/lib and the SOURCES.txt of ./*.egg-info (left by
    `pip install -e`) and never prunes them, so a file dropped from the package data would still
    ship from an earlier build and the test would pass (seen: a stale egg-info put bpf/calls/*.h
    back into a wheel whose package-data no longer named them)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout to tell the sources from build outputs")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_symlink():  # otel_eacgm/bpf -> ../bpf: a link in the checkout, a link in the copy
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(src), dest / rel)
        elif src.is_file():  # listed but deleted in the worktree: not part of it
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built by pip (with build isolation, as `pip install .` would)."""
    work = tmp_path_factory.mktemp("wheel")
    src = _checkout_copy(work / "src")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", str(src), "-w", str(work / "dist")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    (built,) = (work / "dist").glob("otel_eacgm-*.whl")
    return built


@pytest.fixture(scope="module")
def clean_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv on Debian's python3.11 with the wheel and its dependencies from the index."""
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"needs {SYSTEM_PYTHON} (Debian's, with python3-bpfcc)")
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    started = time.monotonic()
    proc = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--no-input", str(wheel)],
                          capture_output=True, text=True, timeout=540, env=_clean_env(), cwd=venv)
    assert proc.returncode == 0, f"pip install {wheel.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    print(f"installed {wheel.name} with its dependencies in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return venv


def _includes(names: set[str], unit: PurePosixPath, wheel: zipfile.ZipFile) -> set[PurePosixPath]:
    """Every file `#include "..."` reaches from `unit`, resolved as BCC does: beside the including
    file, then in the -I directory (the package); fails on one the wheel does not hold."""
    seen: set[PurePosixPath] = set()
    todo = [unit]
    while todo:
        path = todo.pop()
        for line in wheel.read(str(path)).decode().splitlines():
            stripped = line.strip()
            if not (stripped.startswith("#") and stripped[1:].lstrip().startswith("include")):
                continue
            target = stripped.split("include", 1)[1].strip()
            if not target.startswith('"'):
                continue  # <...>: kernel and BCC headers, found on the host
            rel = target[1:target.index('"', 1)]
            candidates = list(dict.fromkeys([path.parent / rel, BPF_PACKAGE / rel]))
            found = next((c for c in candidates if str(c) in names), None)
            assert found, f"{path} includes \"{rel}\", which the wheel does not hold (looked for {candidates})"
            if found not in seen:
                seen.add(found)
                todo.append(found)
    return seen


def test_wheel_ships_every_bpf_source_and_no_tests(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        shipped = set()
        for unit in UNITS:
            path = BPF_PACKAGE / unit
            assert str(path) in names, f"{wheel.name} lacks {path}"
            shipped |= {path} | _includes(names, path, whl)
        assert BPF_PACKAGE / "events.h" in shipped
        # The very files of this checkout, not copies left in a build directory.
        for path in shipped:
            assert whl.read(str(path)) == (REPO / "bpf" / path.relative_to(BPF_PACKAGE)).read_bytes(), path
    sources = {BPF_PACKAGE / p.relative_to(REPO / "bpf") for p in (REPO / "bpf").rglob("*") if p.suffix in (".c", ".h")}
    assert not {str(p) for p in sources} - names, "BPF sources under bpf/ missing from the wheel"

    tests = [n for n in names if "tests" in PurePosixPath(n).parts or PurePosixPath(n).name.startswith("test_")
             or PurePosixPath(n).name == "conftest.py"]
    assert not tests, f"the wheel ships tests: {tests}"
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    top = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    assert top == {p.split(".")[0] for p in packages}, f"unexpected top-level entries in the wheel: {top}"


@pytest.mark.ebpf
@pytest.mark.timeout(900)
def test_installed_agent_traces_real_libraries(clean_venv: Path, tmp_path: Path) -> None:
    assert not tmp_path.is_relative_to(REPO)
    python, agent = clean_venv / "bin/python", clean_venv / "bin/otel-eacgm"
    where = subprocess.run([str(python), "-c", "import bcc, otel_eacgm, otel_eacgm.bpf as b; "
                            "print(otel_eacgm.__file__); print(b.SOURCE_DIR)"],
                           capture_output=True, text=True, cwd=tmp_path, env=_clean_env(), timeout=60)
    assert where.returncode == 0, where.stderr[-3000:]
    for line in where.stdout.split():
        assert Path(line).is_relative_to(clean_venv), f"{line} is not in the clean venv {clean_venv}"

    out = tmp_path / "trace.json"
    # The workload runs on the project's venv, which has the nvidia-* wheels; only the agent is
    # the installed one. --dump-bpf prints the cflags BCC got, -I naming where the headers came from.
    proc = subprocess.run([str(agent), "trace", "--perfetto", str(out), "--layers", "cuda.runtime,nccl",
                           "--launch-layer", "cuda.runtime", "--dump-bpf", "--", sys.executable, str(WORKLOAD),
                           json.dumps(PLAN)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=240,
                          env=_clean_env(OTEL_EACGM_GPU_METRICS="0"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (cflags,) = [line for line in proc.stdout.splitlines() if line.startswith("// cflags:")]
    include_dir = next(f[2:] for f in cflags.split() if f.startswith("-I"))
    assert Path(include_dir).is_relative_to(clean_venv), cflags

    calls = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"fn"')]
    assert len(calls) == sum(n for _, n in PLAN)
    pid = calls[0]["tid"]  # the workload's main thread
    spans = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X" and e["pid"] == pid]
    assert collections.Counter(e["name"] for e in spans) == collections.Counter(c["fn"] for c in calls)
    # the libraries' own answers (error codes without a GPU) reached the spans
    answers = {(c["fn"], c["rc"]) for c in calls}
    returned = [(e["name"], e["args"]["eacgm.call.return_code"]) for e in spans if "eacgm.call.return_code" in e["args"]]
    assert returned and set(returned) <= answers, (returned, answers)
    assert summary(proc.stderr)["calls"] == len(calls)
