"""A test workload for threads that switch interpreters: each of three threads per round makes
its own subinterpreter, calls a real libcudart function from the main interpreter, then from a
function compiled in the subinterpreter (the same OS thread, now on another PyThreadState),
then from the main interpreter again, and destroys the subinterpreter (its thread states and
code objects are freed while the agent may still hold them).

usage: python_interpreters.py LIBCUDART ROUNDS
Function sub_K is compiled in the subinterpreter from a file named <sub-K> with K blank lines
before its `def`: a span named sub_K must say file <sub-K> and line K + 1, or it was named
after another code object. Prints {"pid", "calls"} at the end.
"""

import ctypes
import json
import os
import sys
import threading
import time

try:
    import _interpreters as interpreters  # 3.13+
except ImportError:
    import _xxsubinterpreters as interpreters  # 3.10-3.12

LIB = sys.argv[1]
ROUNDS = int(sys.argv[2])
rt = ctypes.CDLL(LIB)


def create():
    if sys.version_info[:2] == (3, 12):  # 3.12's isolated subinterpreters refuse to import _ctypes
        return interpreters.create(isolated=False)
    return interpreters.create()


def sub_source(k):
    body = "\n" * k + f"def sub_{k}(rt):\n    return rt.cudaSetDevice(3)\n"
    return (f"import ctypes\nrt = ctypes.CDLL({LIB!r})\nscope = {{}}\n"
            f"exec(compile({body!r}, '<sub-{k}>', 'exec'), scope)\nscope['sub_{k}'](rt)\n")


def hop(k):
    interp = create()
    rt.cudaSetDevice(3)  # from the main interpreter
    interpreters.run_string(interp, sub_source(k))  # this thread, in the subinterpreter
    rt.cudaSetDevice(3)  # back in the main interpreter
    interpreters.destroy(interp)


time.sleep(0.3)  # let the agent finish attaching
calls = 0
for r in range(ROUNDS):
    threads = [threading.Thread(target=hop, args=(1 + r * 3 + t,)) for t in range(2)]
    for t in threads:
        t.start()
    hop(1 + r * 3 + 2)
    for t in threads:
        t.join()
    calls += 9
print(json.dumps({"pid": os.getpid(), "calls": calls}), flush=True)
