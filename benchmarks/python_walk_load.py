"""Load for benchmarks/python_frame_walk.py: libcudart's cudaSetDevice called from Python with a
given number of Python frames on the stack, in steps the benchmark paces through stdin/stdout
(it reads the kernel's BPF run-time statistics between steps).

usage: python_walk_load.py LIBCUDART CALLS DEPTH...
For each depth: prints `ready DEPTH`, waits for a line on stdin, makes CALLS calls at that depth,
prints `done DEPTH`, waits for a line again.
"""

import ctypes
import sys

rt = ctypes.CDLL(sys.argv[1])
CALLS = int(sys.argv[2])
DEPTHS = [int(d) for d in sys.argv[3:]]
set_device, arg = rt.cudaSetDevice, ctypes.c_int(3)


def calls(n):
    for _ in range(n):
        set_device(arg)


def at_depth(depth, n):
    """`calls` with `depth` Python frames on the stack: the module's, depth - 2 of these, calls'."""
    return calls(n) if depth <= 3 else at_depth(depth - 1, n)


at_depth(8, 1000)  # warm up: code objects named once, caches filled
for d in DEPTHS:
    print(f"ready {d}", flush=True)
    sys.stdin.readline()
    at_depth(d, CALLS)
    print(f"done {d}", flush=True)
    sys.stdin.readline()
