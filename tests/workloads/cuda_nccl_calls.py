"""A test workload: calls real libcudart and libnccl functions through ctypes.

Without a GPU every call fails with a real error code. Prints one JSON line per call with the
wall-clock bracket around it, so tests can check span timestamps.
usage: cuda_nccl_calls.py PLAN_JSON   (a list of [function, repeat] pairs)
Environment (for tests of libraries loaded late): EACGM_LOAD_FILE: load the libraries only once
this file exists; EACGM_WAIT_FILE: start calling only once this file exists.
"""

import ctypes
import json
import os
import sys
import time
from pathlib import Path

import nvidia.cu13
import nvidia.nccl

CUDART = str(Path(list(nvidia.cu13.__path__)[0]) / "lib" / "libcudart.so.13")
NCCL = str(Path(list(nvidia.nccl.__path__)[0]) / "lib" / "libnccl.so.2")


def calls(rt: ctypes.CDLL, nccl: ctypes.CDLL) -> dict:
    p = ctypes.c_void_p()
    u64, u32, sz = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_size_t
    vp = ctypes.c_void_p
    return {
        "cudaMalloc": lambda: rt.cudaMalloc(ctypes.byref(p), sz(1 << 20)),
        "cudaFree": lambda: rt.cudaFree(vp(0x7000)),
        "cudaMemcpy": lambda: rt.cudaMemcpy(vp(0x1000), vp(0x2000), sz(4096), ctypes.c_int(1)),
        "cudaMemcpyAsync": lambda: rt.cudaMemcpyAsync(vp(0x1000), vp(0x2000), sz(8192), ctypes.c_int(2), vp(0x55)),
        "cudaMemset": lambda: rt.cudaMemset(vp(0x1000), ctypes.c_int(0), sz(512)),
        "cudaDeviceSynchronize": lambda: rt.cudaDeviceSynchronize(),
        "cudaStreamSynchronize": lambda: rt.cudaStreamSynchronize(vp(0x55)),
        "cudaSetDevice": lambda: rt.cudaSetDevice(ctypes.c_int(3)),
        # cudaGetErrorName's address as the host stub, grid (2,3,4) block (32,1,1), 48 B smem, stream 0x55
        "cudaLaunchKernel": lambda: rt.cudaLaunchKernel(ctypes.cast(rt.cudaGetErrorName, vp), u64(2 | (3 << 32)), u32(4), u64(32 | (1 << 32)),
                                                          u32(1), None, sz(48), vp(0x55)),
        # nvcc 12.8+ stubs: resolve the "kernel" at cudaGetErrorName's address to a handle
        "__cudaGetKernel": lambda: getattr(rt, "__cudaGetKernel")(ctypes.byref(p), ctypes.cast(rt.cudaGetErrorName, vp)),
        # 1000 float32 (7), sum (0), comm NULL, stream 0x66
        "ncclAllReduce": lambda: nccl.ncclAllReduce(vp(0x10), vp(0x20), sz(1000), ctypes.c_int(7), ctypes.c_int(0),
                                                    None, vp(0x66)),
        # 256 bfloat16 (9), max (2), root 1, comm NULL, stream 0x77 (8 args: comm and stream on the stack)
        "ncclReduce": lambda: nccl.ncclReduce(vp(0x10), vp(0x20), sz(256), ctypes.c_int(9), ctypes.c_int(2),
                                              ctypes.c_int(1), None, vp(0x77)),
        "ncclSend": lambda: nccl.ncclSend(vp(0x10), sz(64), ctypes.c_int(4), ctypes.c_int(5), None, vp(0x66)),
        "ncclGroupStart": lambda: nccl.ncclGroupStart(),
        "ncclGroupEnd": lambda: nccl.ncclGroupEnd(),
    }


def wait_for(path: str | None, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while path and not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.01)


def main() -> None:
    plan = json.loads(sys.argv[1])
    wait_for(os.environ.get("EACGM_LOAD_FILE"))
    rt = ctypes.CDLL(CUDART)
    nccl = ctypes.CDLL(NCCL)
    wait_for(os.environ.get("EACGM_WAIT_FILE"))
    table = calls(rt, nccl)
    for name, repeat in plan:
        for _ in range(repeat):
            t0 = time.time_ns()
            rc = table[name]()
            t1 = time.time_ns()
            print(json.dumps({"fn": name, "rc": rc, "t0": t0, "t1": t1, "tid": __import__("threading").get_native_id()}), flush=True)


if __name__ == "__main__":
    main()
