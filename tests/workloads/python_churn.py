"""A test workload for torn and stale Python frames: it creates and drops many functions (each
a fresh code object, compiled from source, soon freed and its memory reused) and many
short-lived threads, all calling a real libcudart function while traced.

usage: python_churn.py LIBCUDART ROUNDS
Function gen_K is compiled from a file named <churn-K> with K blank lines before its `def`, so
its first line is K + 1: a span named gen_K must say file <churn-K> and line K + 1, or it was
named after another code object. Each thread's first 10 functions of a round are freed at once
(most before the agent reads them); its last 10 live on until the round's end (the agent names
them, and caches them by address), then are freed, and the next round's code objects of the
same size take their memory. Prints, per thread, the K of each of its calls in order, then
{"pid", "calls"}.
"""

import ctypes
import gc
import json
import os
import sys
import threading
import time

rt = ctypes.CDLL(sys.argv[1])
ROUNDS = int(sys.argv[2])


def make(k):
    source = "\n" * k + f"def gen_{k}(rt, c):\n    return rt.cudaSetDevice(c(3))\n"
    scope = {}
    exec(compile(source, f"<churn-{k}>", "exec"), scope)
    return scope[f"gen_{k}"]


def worker(base):
    kept = []
    for k in range(base, base + 20):
        fn = make(k)
        fn(rt, ctypes.c_int)
        if k >= base + 10:
            kept.append(fn)
        del fn
        gc.collect(0)
    time.sleep(0.1)  # the kept functions live on while the agent reads the round's frames
    made.append({"tid": threading.get_native_id(), "ks": list(range(base, base + 20))})


time.sleep(0.3)  # let the agent finish attaching
calls = 0
made = []
for r in range(ROUNDS):
    threads = [threading.Thread(target=worker, args=(1 + (r * 4 + t) * 20,)) for t in range(4)]
    for t in threads:
        t.start()
    worker(10_000 + r * 20)
    for t in threads:
        t.join()
    calls += 100
for line in made:
    print(json.dumps(line))
print(json.dumps({"pid": os.getpid(), "calls": calls}), flush=True)
