"""A test workload for the driver layer: calls a libcuda (the stand-in built by the tests).

usage: driver_calls.py LIBCUDA_PATH STEPS...   steps: names, lib, launch, launch_ex, launch_null,
ctx_sync, alloc_free, copy, hang (blocks in cuStreamSynchronize until killed)
"""

import ctypes
import json
import sys
import time

KERNEL = b"_Z10vector_addPfS_S_i"
LIB_KERNEL = b"_Z6reduceIfEvPT_i"


class LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


def main() -> None:
    cu = ctypes.CDLL(sys.argv[1])
    vp, u = ctypes.c_void_p, ctypes.c_uint
    func, kernel, kfunc, dptr = vp(), vp(), vp(), ctypes.c_uint64()
    for step in sys.argv[2:]:
        t0 = time.time_ns()
        if step == "names":
            rc = cu.cuModuleGetFunction(ctypes.byref(func), vp(0x42), KERNEL)
        elif step == "lib":
            rc = cu.cuLibraryGetKernel(ctypes.byref(kernel), vp(0x43), LIB_KERNEL)
            rc |= cu.cuKernelGetFunction(ctypes.byref(kfunc), kernel)
        elif step == "launch":
            rc = cu.cuLaunchKernel(func, u(8), u(4), u(2), u(256), u(1), u(1), u(1024), vp(0x99), None, None)
        elif step == "launch_ex":
            cfg = LaunchConfig((u * 3)(16, 1, 1), (u * 3)(128, 2, 1), 2048, vp(0x98), None, 0)
            rc = cu.cuLaunchKernelEx(ctypes.byref(cfg), kfunc, None, None)
        elif step == "launch_null":
            rc = cu.cuLaunchKernel(None, u(1), u(1), u(1), u(1), u(1), u(1), u(0), None, None, None)
        elif step == "ctx_sync":
            rc = cu.cuCtxSynchronize()
        elif step == "alloc_free":
            rc = cu.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(4096))
            rc |= cu.cuMemFree_v2(dptr)
        elif step == "copy":
            rc = cu.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(0x10), vp(0x20), ctypes.c_size_t(777), vp(0x97))
        elif step == "hang":
            print(json.dumps({"step": "hang", "t0": t0}), flush=True)
            cu.cuStreamSynchronize(vp(0xDEAD))
            rc = -1
        else:
            raise SystemExit(f"unknown step {step}")
        print(json.dumps({"step": step, "rc": rc, "t0": t0, "t1": time.time_ns()}), flush=True)


if __name__ == "__main__":
    main()
