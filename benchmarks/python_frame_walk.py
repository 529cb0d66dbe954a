"""Cost of the Python frame walk per probe hit, at frame depths 8, 32 and 64, against the same
calls traced without it (python_frames off), side by side.

The agent traces libcudart (`--layers cuda.runtime`, every call sent: span_sample_ratio 1, so
every call walks) while benchmarks/python_walk_load.py calls cudaSetDevice from Python at each
depth; the load times its own calls. Agent runs alternate walk on / walk off, `--rounds` each;
inside a run the depths alternate too. Medians of ns per call are printed, and the walk's cost
per hit (on - off) at each depth. Needs root (BPF).

    sudo .venv/bin/python benchmarks/python_frame_walk.py --rounds 3 --calls 20000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYENV_312 = Path("/root/.pyenv/versions/3.12.1/bin/python3.12")
DEPTHS = (8, 32, 64)


def libcudart() -> str:
    import nvidia.cu13  # noqa: PLC0415 - the venv's wheel

    return str(Path(list(nvidia.cu13.__path__)[0]) / "lib" / "libcudart.so.13")


def one_run(python: str, walk: bool, calls: int, inner_rounds: int) -> dict[int, list[float]]:
    """One agent run over the load; ns per call by depth."""
    cmd = [str(REPO / ".venv/bin/otel-eacgm"), "trace", "--perfetto", os.devnull, "--layers", "cuda.runtime", "--",
           python, str(REPO / "benchmarks/python_walk_load.py"), libcudart(), str(calls), str(inner_rounds),
           *map(str, DEPTHS)]
    env = dict(os.environ, OTEL_EACGM_SPAN_SAMPLE_RATIO="1", OTEL_EACGM_PYTHON_FRAMES="1" if walk else "0",
               OTEL_EACGM_GPU_METRICS="0", OTEL_EACGM_PYTHON_FRAME_DEPTH="64")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"agent run failed:\n{proc.stderr[-3000:]}")
    line = next(line for line in proc.stdout.splitlines() if line.startswith("{"))
    return {int(k): v for k, v in json.loads(line).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="agent runs per mode, alternating")
    ap.add_argument("--calls", type=int, default=20000, help="calls per depth per inner round")
    ap.add_argument("--inner-rounds", type=int, default=3)
    ap.add_argument("--python", default=str(PYENV_312) if PYENV_312.exists() else sys.executable)
    args = ap.parse_args()
    samples: dict[bool, dict[int, list[float]]] = {True: {d: [] for d in DEPTHS}, False: {d: [] for d in DEPTHS}}
    for _ in range(args.rounds):
        for walk in (False, True):
            for depth, values in one_run(args.python, walk, args.calls, args.inner_rounds).items():
                samples[walk][depth].extend(values)
    print(f"python {args.python}; {args.rounds} agent runs per mode x {args.inner_rounds} inner rounds x "
          f"{args.calls} calls per depth; medians, ns per traced call")
    print(f"{'depth':>5} {'walk off':>10} {'walk on':>10} {'walk cost':>10}")
    for d in DEPTHS:
        off, on = statistics.median(samples[False][d]), statistics.median(samples[True][d])
        print(f"{d:>5} {off:>10.0f} {on:>10.0f} {on - off:>+10.0f}")


if __name__ == "__main__":
    main()
