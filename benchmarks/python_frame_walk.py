"""Cost of the Python frame walk per probe hit at frame depths 8, 32 and 64, against the same
calls traced without it (python_frames off), side by side.

The agent traces libcudart (`--layers cuda.runtime`; every call is sent, span_sample_ratio 1,
so every call walks) while benchmarks/python_walk_load.py calls cudaSetDevice from Python at
each depth. The figure is the kernel's own run time of the agent's BPF programs (BPF_ENABLE_STATS
while this runs; run_time_ns / run_cnt of each program, read between the load's steps), per
traced call: the uprobe trap itself costs the same with and without the walk and is left out,
and so is the contention of other processes on user space. Agent runs alternate walk off / on,
`--rounds` each; medians over rounds. Needs root.

    sudo .venv/bin/python benchmarks/python_frame_walk.py --rounds 5 --calls 20000
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYENV_312 = Path("/root/.pyenv/versions/3.12.1/bin/python3.12")
DEPTHS = (8, 32, 64)

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_BPF = 321  # x86-64
_PROG_GET_NEXT_ID, _PROG_GET_FD_BY_ID, _OBJ_GET_INFO_BY_FD, _ENABLE_STATS = 11, 13, 15, 32
_INFO_SIZE = 256
_NAME, _RUN_TIME, _RUN_CNT = 64, 192, 200  # offsets in struct bpf_prog_info


def _bpf(cmd: int, attr: ctypes.Array) -> int:
    return _libc.syscall(_SYS_BPF, cmd, ctypes.byref(attr), ctypes.sizeof(attr))


def enable_stats() -> int:
    """BPF run-time statistics on while the returned descriptor is open."""
    attr = (ctypes.c_uint8 * 8)()  # enable_stats.type = BPF_STATS_RUN_TIME (0)
    fd = _bpf(_ENABLE_STATS, attr)
    if fd < 0:
        raise SystemExit(f"BPF_ENABLE_STATS failed: {os.strerror(ctypes.get_errno())} (root needed)")
    return fd


def program_stats(min_id: int) -> dict[int, tuple[str, int, int]]:
    """id -> (name, run_time_ns, run_cnt) of every BPF program with an id above `min_id`."""
    out = {}
    prog_id = min_id
    while True:
        attr = (ctypes.c_uint32 * 4)(prog_id)
        if _bpf(_PROG_GET_NEXT_ID, attr) != 0:
            return out
        prog_id = attr[1]
        fd_attr = (ctypes.c_uint32 * 4)(prog_id)
        fd = _bpf(_PROG_GET_FD_BY_ID, fd_attr)
        if fd < 0:
            continue
        info = (ctypes.c_uint8 * _INFO_SIZE)()
        get_attr = (ctypes.c_uint32 * 4)(fd, _INFO_SIZE, 0, 0)
        ctypes.memmove(ctypes.addressof(get_attr) + 8, ctypes.byref(ctypes.c_uint64(ctypes.addressof(info))), 8)
        if _bpf(_OBJ_GET_INFO_BY_FD, get_attr) == 0:
            raw = bytes(info)
            name = raw[_NAME:_NAME + 16].split(b"\0")[0].decode()
            out[prog_id] = (name, int.from_bytes(raw[_RUN_TIME:_RUN_TIME + 8], "little"),
                            int.from_bytes(raw[_RUN_CNT:_RUN_CNT + 8], "little"))
        os.close(fd)


def max_program_id() -> int:
    return max(program_stats(0), default=0)


def libcudart() -> str:
    import nvidia.cu13  # noqa: PLC0415 - the venv's wheel

    return str(Path(list(nvidia.cu13.__path__)[0]) / "lib" / "libcudart.so.13")


def _total(stats: dict[int, tuple[str, int, int]]) -> int:
    return sum(t for _name, t, _cnt in stats.values())


def one_run(python: str, walk: bool, calls: int) -> dict[int, float]:
    """One agent run over the load: BPF ns per traced call at each depth."""
    before = max_program_id()
    cmd = [str(REPO / ".venv/bin/otel-eacgm"), "trace", "--perfetto", os.devnull, "--layers", "cuda.runtime", "--",
           python, str(REPO / "benchmarks/python_walk_load.py"), libcudart(), str(calls), *map(str, DEPTHS)]
    env = dict(os.environ, OTEL_EACGM_SPAN_SAMPLE_RATIO="1", OTEL_EACGM_PYTHON_FRAMES="1" if walk else "0",
               OTEL_EACGM_GPU_METRICS="0", OTEL_EACGM_PYTHON_FRAME_DEPTH="64", OTEL_EACGM_OVERHEAD_BUDGET="0")
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    out: dict[int, float] = {}
    start = 0
    for line in proc.stdout:
        if not line.startswith(("ready ", "done ")):
            continue
        word, depth = line.split()
        if word == "ready":
            start = _total(program_stats(before))
        else:
            out[int(depth)] = (_total(program_stats(before)) - start) / calls
        proc.stdin.write("\n")
        proc.stdin.flush()
    if proc.wait() != 0 or len(out) != len(DEPTHS):
        raise SystemExit(f"agent run failed (status {proc.returncode}, {len(out)} depths measured)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="agent runs per mode, alternating")
    ap.add_argument("--calls", type=int, default=20000, help="calls per depth per run")
    ap.add_argument("--python", default=str(PYENV_312) if PYENV_312.exists() else sys.executable)
    args = ap.parse_args()
    stats_fd = enable_stats()
    samples: dict[bool, dict[int, list[float]]] = {w: {d: [] for d in DEPTHS} for w in (False, True)}
    try:
        for _ in range(args.rounds):
            for walk in (False, True):
                for depth, ns in one_run(args.python, walk, args.calls).items():
                    samples[walk][depth].append(ns)
    finally:
        os.close(stats_fd)
    print(f"python {args.python}; {args.rounds} agent runs per mode, {args.calls} calls per depth each; "
          "BPF run time per traced call (entry + return programs), medians")
    print(f"{'depth':>5} {'walk off':>10} {'walk on':>10} {'walk cost':>10}   (ns; walk-on runs: min..max)")
    for d in DEPTHS:
        off, on = statistics.median(samples[False][d]), statistics.median(samples[True][d])
        print(f"{d:>5} {off:>10.0f} {on:>10.0f} {on - off:>+10.0f}   "
              f"({min(samples[True][d]):.0f}..{max(samples[True][d]):.0f})")


if __name__ == "__main__":
    main()
