"""Load for benchmarks/python_frame_walk.py: libcudart's cudaSetDevice called from Python at a
given frame depth, timed per call. Depths are interleaved in rounds inside one process.

usage: python_walk_load.py LIBCUDART CALLS ROUNDS DEPTH...
Prints one JSON line: {"depth": [ns per call, one per round], ...}.
"""

import ctypes
import json
import sys
import time

rt = ctypes.CDLL(sys.argv[1])
CALLS, ROUNDS = int(sys.argv[2]), int(sys.argv[3])
DEPTHS = [int(d) for d in sys.argv[4:]]
set_device, arg = rt.cudaSetDevice, ctypes.c_int(3)


def calls(n):
    t0 = time.perf_counter_ns()
    for _ in range(n):
        set_device(arg)
    return time.perf_counter_ns() - t0


def at_depth(depth, n):
    """Run `calls` with `depth` Python frames on the stack (this one and the module's count)."""
    return calls(n) if depth <= 3 else at_depth(depth - 1, n)


time.sleep(0.5)  # let the agent finish attaching
at_depth(8, 2000)  # warm up: code objects named once, caches filled
out = {d: [] for d in DEPTHS}
for _ in range(ROUNDS):
    for d in DEPTHS:
        out[d].append(at_depth(d, CALLS) / CALLS)
print(json.dumps(out), flush=True)
