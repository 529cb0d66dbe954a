"""The paced call workload (reliability_calls.c): build it, find the real libraries, run it.

The workload is C, not Python, so that tens of thousands of calls per second cost the shared
cores almost nothing but the probes themselves.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "reliability_calls.c"


def libraries() -> tuple[str, str]:
    """libcudart and libnccl of the nvidia wheels this Python has."""
    import nvidia.cu13
    import nvidia.nccl

    cudart = Path(list(nvidia.cu13.__path__)[0]) / "lib" / "libcudart.so.13"
    nccl = Path(list(nvidia.nccl.__path__)[0]) / "lib" / "libnccl.so.2"
    for lib in (cudart, nccl):
        if not lib.exists():
            raise FileNotFoundError(f"{lib} missing: install the test dependencies (pip install -e '.[test]')")
    return str(cudart), str(nccl)


def private_libraries(directory: Path) -> tuple[str, str]:
    """Copies of the libraries (own inodes): probes on them belong to this test alone.

    Uprobes are set per file, and other agents on the machine may probe the wheel's copy; a
    check for leftover breakpoints is only meaningful on a file nobody else traces.
    """
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for lib in libraries():
        dst = directory / Path(lib).name
        shutil.copy2(lib, dst)
        out.append(str(dst))
    return out[0], out[1]


def build(out_dir: Path) -> Path:
    """Compile the workload into out_dir."""
    if shutil.which("gcc") is None:
        raise RuntimeError("gcc is needed to build tests/reliability/reliability_calls.c")
    binary = out_dir / "reliability_calls"
    subprocess.run(["gcc", "-O2", "-Wall", "-o", str(binary), str(SOURCE), "-ldl"], check=True)
    return binary


def rate_command(binary: Path, calls_per_s: int, seconds: float, libs: tuple[str, str] | None = None) -> list[str]:
    """Paced calls (seconds 0: until SIGTERM); each tick is a launch, every fourth adds a group pair."""
    cudart, nccl = libs or libraries()
    return [str(binary), cudart, nccl, "rate", str(calls_per_s), str(seconds)]


def dlclose_command(binary: Path, cycles: int, calls: int) -> list[str]:
    """dlopen / calls / dlclose cycles of libcudart."""
    cudart, nccl = libraries()
    return [str(binary), cudart, nccl, "dlclose", str(cycles), str(calls)]


def json_lines(lines: list[str]) -> list[dict]:
    """The workload's JSON lines among other output."""
    return [json.loads(line) for line in lines if line.startswith("{")]


def totals(lines: list[str]) -> dict:
    """The workload's final {"launch", "group", "calls"} line."""
    found = [d for d in json_lines(lines) if "calls" in d and "cycle" not in d]
    if not found:
        raise AssertionError(f"workload printed no totals: {lines[-5:]}")
    return found[-1]

