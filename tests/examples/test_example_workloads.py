"""The example workloads and their fault injections, run as their README says, on CPU torch
(the CUDA variants run the same code on a GPU). Small models and few steps: seconds each."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = ["--device", "cpu", "--dim", "32", "--layers", "1", "--seq", "16", "--batch", "4"]


def run(*args: str, timeout: float = 120) -> list[str]:
    """`python ARGS`, which must succeed; its stdout and stderr lines."""
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines() + proc.stderr.splitlines()


def step_lines(lines: list[str], word: str = "step") -> dict[int, str]:
    """Step (or batch) number -> its printed line."""
    return {int(m.group(1)): line for line in lines if (m := re.search(rf"\b{word} (\d+) ", line))}


def millis(line: str) -> float:
    """The step time a line reports."""
    return float(re.search(r" ([\d.]+) ms", line).group(1))


FAULT_CHECKS = {  # what each fault's step line must show
    "input-stall": lambda line: millis(line) >= 500 and "input stalled 0.5 s" in line,
    "straggler": lambda line: millis(line) >= 300 and "extra 512x512 products" in line,
    "comm-slowdown": lambda line: "4 extra all-reduces of each of" in line and "(gloo, world size 1)" in line,
    "memory-pressure": lambda line: "allocated and freed 192 MiB in 3 chunks" in line,
}


@pytest.mark.parametrize("fault", sorted(FAULT_CHECKS))
def test_train_with_each_fault(fault: str) -> None:
    check = FAULT_CHECKS[fault]
    steps = step_lines(run(str(EXAMPLES / "train.py"), *SMALL, "--steps", "4", "--fault", fault, "--fault-every", "2"))
    assert sorted(steps) == [0, 1, 2, 3]
    assert [s for s, line in steps.items() if f"fault={fault}:" in line] == [1, 3]
    assert all(check(steps[s]) for s in (1, 3)), steps


def test_ddp_falls_back_to_gloo_and_waits_for_a_straggler() -> None:
    lines = run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLES / "train_ddp.py"),
                *SMALL[2:], "--steps", "3", "--fault", "straggler", "--fault-rank", "1", "--fault-every", "2")
    assert sum("no GPU: falling back to gloo on CPU" in line for line in lines) == 2
    ranks = {r: {int(m.group(1)): line for line in lines if line.startswith(f"rank {r}/2 (gloo)")
                 and (m := re.search(r" step (\d+) ", line))} for r in (0, 1)}
    assert sorted(ranks[0]) == sorted(ranks[1]) == [0, 1, 2]
    assert "fault=straggler" in ranks[1][1] and "fault=" not in ranks[0][1]
    # DDP's gradient all-reduce holds rank 0 until the straggler's backward is done
    assert millis(ranks[0][1]) >= 250, ranks[0][1]


def test_inference_loop_with_an_input_stall() -> None:
    lines = run(str(EXAMPLES / "inference.py"), *SMALL, "--batches", "4", "--fault", "input-stall", "--fault-every", "2")
    batches = step_lines(lines, "batch")
    assert sorted(batches) == [0, 1, 2, 3]
    assert all(millis(batches[b]) >= 500 for b in (1, 3))
    assert lines[-1].startswith("4 batches: p50 ") and " p99 " in lines[-1]


def test_gpu_contention_runs_kernels_for_the_time_asked() -> None:
    lines = run(str(EXAMPLES / "faults/gpu_contention.py"), "--device", "cpu", "--seconds", "1", "--size", "128")
    assert "contending for the CPU instead" in lines[0]
    assert lines[1] == "gpu_contention: running on cpu"  # the benchmark starts measuring at this line
    done = re.search(r"done, (\d+) products of 128x128 in 1 s", lines[-1])
    assert done and int(done.group(1)) > 0, lines


def test_cuda_steps_reports_its_calls_and_the_comm_fault() -> None:
    lines = run(str(EXAMPLES / "cuda_steps.py"), "--steps", "4", "--step-time", "0", "--json", "--comm-fault", "2:3")
    steps = [json.loads(line) for line in lines]
    assert [s["comm_fault"] for s in steps] == [False, True, True, False]
    for s in steps:
        assert s["calls"]["ncclAllReduce"] == (9 if s["comm_fault"] else 1)
        assert s["calls"]["cudaLaunchKernel"] == 8 and s["start"] <= s["end"]


def test_readme_has_a_command_for_every_example() -> None:
    readme = (EXAMPLES / "README.md").read_text()
    scripts = [p for p in EXAMPLES.rglob("*.py") if p.name != "__init__.py"]
    fault_modules = {p.stem.replace("_", "-") for p in (EXAMPLES / "faults").glob("*.py")
                     if p.stem not in ("__init__", "base", "gpu_contention")}
    assert fault_modules == set(FAULT_CHECKS), "a fault without a smoke test above"
    missing = [str(p.relative_to(EXAMPLES)) for p in scripts
               if p.parent.name != "faults" and f"examples/{p.relative_to(EXAMPLES)}" not in readme]
    assert not missing, f"examples/README.md has no command for {missing}"
    assert "examples/faults/gpu_contention.py" in readme
    assert all(f"--fault {name}" in readme for name in fault_modules)
