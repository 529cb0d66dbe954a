"""CPU the agent's Python garbage collector takes, by generation, over one agent run.

Runs `otel-eacgm ARGS...` in this process with a gc callback timing each collection on the
collecting thread's CPU clock, and prints the totals at exit. Used to size the agent's gc
settings (agent.py: gc.freeze() after start-up, a larger youngest generation):

    OTEL_EACGM_SPAN_SAMPLE_RATIO=1 .venv/bin/python benchmarks/agent_gc_time.py agent \\
        --endpoint http://127.0.0.1:4317 --insecure --layers cuda.runtime -- build/call_loop RT NCCL free 100000 20000
"""

from __future__ import annotations

import atexit
import gc
import sys
import time

_started = [0.0]
_cpu = [0.0, 0.0, 0.0]
_count = [0, 0, 0]


def _time(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0] = time.thread_time()
    else:
        _cpu[info["generation"]] += time.thread_time() - _started[0]
        _count[info["generation"]] += 1


def main() -> None:
    gc.callbacks.append(_time)
    atexit.register(lambda: print(f"gc CPU s by generation {[round(c, 3) for c in _cpu]}, collections {_count}",
                                  file=sys.stderr))
    sys.argv = ["otel-eacgm", *sys.argv[1:]]
    from otel_eacgm.cli import main as agent_main

    agent_main()


if __name__ == "__main__":
    main()
