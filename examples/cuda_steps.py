"""Example workload for machines without a GPU: a training-step-shaped loop of real CUDA and NCCL calls.

Each step allocates, copies, launches a few "kernels", all-reduces and synchronizes through the
real `libcudart` and `libnccl` of the `nvidia-cuda-runtime` / `nvidia-nccl-cu13` wheels (a
PyTorch install ships the same libraries). Without a GPU every call fails with the library's
real error code, so the agent's spans show real error statuses; with a GPU it would fail too
(the pointers are not real): use examples/train.py there.

    sudo .venv/bin/otel-eacgm agent -- .venv/bin/python examples/cuda_steps.py --steps 20
`--slow-step N` stalls every Nth step on the host (a slow synchronize) for anomaly demos.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from pathlib import Path

import nvidia.cu13
import nvidia.nccl

CUDART = Path(list(nvidia.cu13.__path__)[0]) / "lib" / "libcudart.so.13"
NCCL = Path(list(nvidia.nccl.__path__)[0]) / "lib" / "libnccl.so.2"
FLOAT32, SUM = 7, 0  # ncclFloat32, ncclSum
HOST_TO_DEVICE, DEVICE_TO_HOST = 1, 2


def step(rt: ctypes.CDLL, nccl: ctypes.CDLL, launches: int, stall_s: float) -> None:
    """One step: inputs in, forward/backward launches, gradient all-reduce, loss out."""
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    buf, stream = vp(0x1000), vp(0x55)
    ptr = vp()
    rt.cudaMalloc(ctypes.byref(ptr), sz(64 << 20))
    rt.cudaMemcpyAsync(buf, vp(0x2000), sz(1 << 20), ctypes.c_int(HOST_TO_DEVICE), stream)
    kernel = ctypes.cast(rt.cudaGetErrorString, vp)  # a real function address stands in for a kernel stub
    for i in range(launches):
        rt.cudaLaunchKernel(kernel, ctypes.c_uint64(128 + i | (1 << 32)), ctypes.c_uint32(1),
                            ctypes.c_uint64(256 | (1 << 32)), ctypes.c_uint32(1), None, sz(0), stream)
    nccl.ncclAllReduce(buf, buf, sz(1 << 20), ctypes.c_int(FLOAT32), ctypes.c_int(SUM), None, stream)
    if stall_s:
        time.sleep(stall_s)
    rt.cudaStreamSynchronize(stream)
    rt.cudaMemcpy(vp(0x3000), buf, sz(4), ctypes.c_int(DEVICE_TO_HOST))
    rt.cudaFree(ptr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--launches", type=int, default=8, help="kernel launches per step")
    ap.add_argument("--step-time", type=float, default=0.05, help="seconds between steps")
    ap.add_argument("--slow-step", type=int, default=0, help="every Nth step stalls 0.3 s (0: never)")
    args = ap.parse_args()
    rt, nccl = ctypes.CDLL(str(CUDART)), ctypes.CDLL(str(NCCL))
    for n in range(1, args.steps + 1):
        slow = args.slow_step and n % args.slow_step == 0
        step(rt, nccl, args.launches, 0.3 if slow else 0.0)
        print(f"step {n}/{args.steps}{' (slow)' if slow else ''}", flush=True)
        time.sleep(args.step_time)


if __name__ == "__main__":
    main()
