"""A test workload for probes scoped to processes: its children make calls the moment they exist.

Loads libcudart, prints its pid, waits for EACGM_WAIT_FILE (if set), then:
  - forks FORKS children one after the other, each making CALLS failing cudaFree calls from its
    first instruction on (no exec: they use the library their parent mapped) and exiting;
  - makes CALLS failing cudaFree calls itself;
  - runs SPAWNS children through fork+exec of tests/workloads/cuda_nccl_calls.py (they map the
    library after the exec), each making CALLS failing cudaFree calls.
Prints one JSON line at the end: {"parent": pid, "forked": [pids], "spawned": [pids]}, then
waits for EACGM_EXIT_FILE (if set) before exiting.
usage: forking_calls.py CALLS FORKS SPAWNS
"""

import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nvidia.cu13

CUDART = str(Path(list(nvidia.cu13.__path__)[0]) / "lib" / "libcudart.so.13")
CALLS_SCRIPT = str(Path(__file__).with_name("cuda_nccl_calls.py"))


def wait_for(path: str | None, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while path and not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.01)


def main() -> None:
    calls, forks, spawns = (int(a) for a in sys.argv[1:4])
    rt = ctypes.CDLL(CUDART)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    wait_for(os.environ.get("EACGM_WAIT_FILE"))
    forked = []
    for _ in range(forks):
        pid = os.fork()
        if pid == 0:
            for _ in range(calls):
                rt.cudaFree(ctypes.c_void_p(0x7000))
            os._exit(0)
        os.waitpid(pid, 0)
        forked.append(pid)
    for _ in range(calls):
        rt.cudaFree(ctypes.c_void_p(0x7000))
    spawned = []
    for _ in range(spawns):
        child = subprocess.run([sys.executable, CALLS_SCRIPT, json.dumps([["cudaFree", calls]])], capture_output=True,
                               text=True, check=True)
        spawned.append(json.loads(child.stdout.splitlines()[-1])["tid"])
    print(json.dumps({"parent": os.getpid(), "forked": forked, "spawned": spawned}), flush=True)
    wait_for(os.environ.get("EACGM_EXIT_FILE"))


if __name__ == "__main__":
    main()
