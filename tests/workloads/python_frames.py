"""A test workload for the Python frame walk: a small "training loop" of plain functions whose
leaves call real libcudart functions (loaded by path, so any CPython 3.10+ runs it; without a
GPU every call fails with a real error code). No profiler, no flag: nothing in the program
helps the tracer.

usage: python_frames.py LIBCUDART [STEPS]
Prints one JSON line per step (its wall-clock bracket) and, at the end, the source lines the
tests check (the line of each call site).
"""

import ctypes
import json
import os
import sys
import time

rt = ctypes.CDLL(sys.argv[1])
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 3


def forward(i):
    rt.cudaSetDevice(ctypes.c_int(i))  # LINE forward.set
    rt.cudaMemset(ctypes.c_void_p(0x1000), ctypes.c_int(0), ctypes.c_size_t(512))  # LINE forward.memset


def step(i):
    forward(i)
    return rt.cudaDeviceSynchronize()  # LINE step.sync


class Trainer:
    def run(self, steps):
        for i in range(steps):
            t0 = time.time_ns()
            step(i)
            print(json.dumps({"step": i, "start": t0, "end": time.time_ns()}), flush=True)


time.sleep(0.3)  # let the agent finish attaching
Trainer().run(STEPS)
print(json.dumps({"pid": os.getpid(), "version": list(sys.version_info[:2])}), flush=True)
# The agent names code objects by reading this process' memory: a process that is gone before
# a loaded agent reads its records leaves those frames unnamed (docs/tracing-layers.md).
time.sleep(1.0)
