"""Example workload for machines without a GPU: a training-step-shaped loop of real CUDA and NCCL calls.

Each step allocates, copies, launches a few "kernels", all-reduces and synchronizes through the
real `libcudart` and `libnccl` of the `nvidia-cuda-runtime` / `nvidia-nccl-cu13` wheels (a
PyTorch install ships the same libraries). Without a GPU every call fails with the library's
real error code, so the agent's spans show real error statuses; with a GPU it would fail too
(the pointers are not real): use examples/train.py there.

    sudo .venv/bin/otel-eacgm agent -- .venv/bin/python examples/cuda_steps.py --steps 20

Faults, for anomaly-detection demos: `--slow-step N` stalls every Nth step on the host (0.3 s
before its synchronize); `--comm-fault FIRST:LAST` makes steps FIRST..LAST a communication
slowdown as the calls show it (extra all-reduces of 16x the bytes). `--json` prints one JSON
line per step with its wall-clock bracket and the calls it made, so a test can compare the
spans it receives with what the workload really called. Run under `python -m cProfile` with the
agent's `python` layer to get a `step` span over each step's calls (CPython 3.11 fires its
function-entry probes only while a profiler is set).
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import time
from pathlib import Path

import nvidia.cu13
import nvidia.nccl

CUDART = Path(list(nvidia.cu13.__path__)[0]) / "lib" / "libcudart.so.13"
NCCL = Path(list(nvidia.nccl.__path__)[0]) / "lib" / "libnccl.so.2"
FLOAT32, SUM = 7, 0  # ncclFloat32, ncclSum
HOST_TO_DEVICE, DEVICE_TO_HOST = 1, 2
GRADIENT_BYTES = 1 << 20


class Libraries:
    """libcudart and libnccl, called by function name and counted: the counts are what a tracer
    must report, one span per call."""

    def __init__(self) -> None:
        self._rt, self._nccl = ctypes.CDLL(str(CUDART)), ctypes.CDLL(str(NCCL))
        self.calls: collections.Counter[str] = collections.Counter()
        # A real function address stands in for a kernel's host stub.
        self.kernel = ctypes.cast(self._rt.cudaGetErrorString, ctypes.c_void_p)

    def __call__(self, name: str, *args: object) -> int:
        self.calls[name] += 1
        return getattr(self._nccl if name.startswith("nccl") else self._rt, name)(*args)


def step(lib: Libraries, launches: int, stall_s: float, extra_allreduces: int) -> None:
    """One step: inputs in, forward/backward launches, gradient all-reduce, loss out."""
    vp, sz, c_int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    buf, stream = vp(0x1000), vp(0x55)
    ptr = vp()
    lib("cudaMalloc", ctypes.byref(ptr), sz(64 << 20))
    lib("cudaMemcpyAsync", buf, vp(0x2000), sz(1 << 20), c_int(HOST_TO_DEVICE), stream)
    for i in range(launches):
        lib("cudaLaunchKernel", lib.kernel, ctypes.c_uint64(128 + i | (1 << 32)), ctypes.c_uint32(1),
            ctypes.c_uint64(256 | (1 << 32)), ctypes.c_uint32(1), None, sz(0), stream)
    lib("ncclAllReduce", buf, buf, sz(GRADIENT_BYTES // 4), c_int(FLOAT32), c_int(SUM), None, stream)
    for _ in range(extra_allreduces):
        lib("ncclAllReduce", buf, buf, sz(16 * GRADIENT_BYTES // 4), c_int(FLOAT32), c_int(SUM), None, stream)
    if stall_s:
        time.sleep(stall_s)
    lib("cudaStreamSynchronize", stream)
    lib("cudaMemcpy", vp(0x3000), buf, sz(4), c_int(DEVICE_TO_HOST))
    lib("cudaFree", ptr)


def step_range(text: str) -> range:
    """'FIRST:LAST' (inclusive, 1-based) as a range of step numbers."""
    first, _, last = text.partition(":")
    try:
        return range(int(first), int(last or first) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FIRST:LAST step numbers, e.g. 40:60")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--launches", type=int, default=8, help="kernel launches per step")
    ap.add_argument("--step-time", type=float, default=0.05, help="seconds between steps")
    ap.add_argument("--slow-step", type=int, default=0, help="every Nth step stalls 0.3 s (0: never)")
    ap.add_argument("--comm-fault", type=step_range, default=range(0), metavar="FIRST:LAST",
                    help="steps with a communication slowdown (extra, larger all-reduces)")
    ap.add_argument("--extra-allreduces", type=int, default=8, help="extra all-reduces per --comm-fault step")
    ap.add_argument("--json", action="store_true", help="one JSON line per step: times and calls made")
    args = ap.parse_args()
    lib = Libraries()
    for n in range(1, args.steps + 1):
        slow = bool(args.slow_step) and n % args.slow_step == 0
        comm = n in args.comm_fault
        before, t0 = lib.calls.copy(), time.time_ns()
        step(lib, args.launches, 0.3 if slow else 0.0, args.extra_allreduces if comm else 0)
        if args.json:
            print(json.dumps({"step": n, "start": t0, "end": time.time_ns(), "slow": slow, "comm_fault": comm,
                              "calls": dict(lib.calls - before)}), flush=True)
        else:
            fault = " (slow)" if slow else " (communication fault)" if comm else ""
            print(f"step {n}/{args.steps}{fault}", flush=True)
        time.sleep(args.step_time)


if __name__ == "__main__":
    main()
