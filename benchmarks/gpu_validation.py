"""On the GPU machine: trace a real PyTorch CUDA training run and report what the agent saw.

Runs `otel-eacgm agent -- python examples/train.py` once per launch layer (cuda.driver, the
default, and cuda.runtime) with spans sent to an in-process OTLP store, then prints per span
name the count, error count and (for launches) the most frequent kernel names, plus the NCCL
attributes. The figures go into docs/gpu-validation.md.
usage: gpu_validation.py [--steps 20] [--python PYTHON] [--layers L1,L2] [--spans-out PREFIX]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from eacgm_testkit.otlp_store import serve  # noqa: E402


def chains(spans: list[dict]) -> collections.Counter:
    """Launch spans by their ancestry of layers, e.g. python > torch > cuda.driver: the
    full-stack trees (Python frame > ATen operator > launch) counted, not just pairs."""
    ids = {s["span_id"]: s for s in spans}
    out: collections.Counter = collections.Counter()
    for s in spans:
        if "cuda.kernel.name" not in s["attributes"] or "Launch" not in s["name"]:
            continue
        layers, p = [s["attributes"].get("eacgm.layer")], ids.get(s["parent_span_id"])
        while p is not None:
            if p["attributes"].get("eacgm.layer") != layers[0]:
                layers.insert(0, p["attributes"].get("eacgm.layer"))
            p = ids.get(p["parent_span_id"])
        out[" > ".join(map(str, layers))] += 1
    return out


def run(layer: str, python: str, steps: int, extra: list[str], spans_out: Path | None) -> None:
    server, store, port = serve()
    cmd = [sys.executable, "-m", "otel_eacgm.cli", "agent", "--endpoint", f"http://127.0.0.1:{port}", "--insecure",
           "--launch-layer", layer, "--", python, str(REPO / "examples/train.py"), "--steps", str(steps), *extra]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OTEL_EACGM_METRICS_INTERVAL_S="1", PYTHONPATH=f"{REPO}:{os.environ.get('PYTHONPATH', '')}"))
    print(f"\n## launch layer {layer}: agent exit {proc.returncode}, {time.time() - t0:.1f} s")
    for line in proc.stderr.splitlines():
        if re.search(r"attached|ready:|done:|short-lived|not in this version|ERROR|Traceback", line):
            print("    " + line.split(" otel-eacgm ", 1)[-1][:300])
    if proc.returncode != 0:
        print(proc.stderr[-4000:])
    time.sleep(1)
    spans = store.spans()
    by_name = collections.Counter(s["name"] for s in spans)
    errors = collections.Counter(s["name"] for s in spans if s["status_code"] == 2)
    print(f"spans: {len(spans)}")
    print("| span | count | errors | layer |")
    print("|---|---|---|---|")
    layer_of = {s["name"]: s["attributes"].get("eacgm.layer") for s in spans}
    for name, n in by_name.most_common():
        print(f"| {name} | {n} | {errors.get(name, 0)} | {layer_of[name]} |")
    kernels = collections.Counter(s["attributes"].get("cuda.kernel.name") for s in spans
                                  if s["name"] in ("cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernel", "cudaLaunchKernelExC"))
    named = sum(n for k, n in kernels.items() if k and k != "[unknown]")
    print(f"\nlaunch spans with a kernel name: {named} of {sum(kernels.values())}; top kernels:")
    for k, n in kernels.most_common(8):
        print(f"    {n:5d}  {k[:160]}")
    nccl = [s for s in spans if s["name"] == "ncclAllReduce"]
    if nccl:
        a = nccl[0]["attributes"]
        print("ncclAllReduce example:", {k: v for k, v in a.items() if k.startswith(("nccl.", "cuda.stream"))})
        print("duration us (median):", sorted((s["end"] - s["start"]) / 1e3 for s in nccl)[len(nccl) // 2])
    nest = collections.Counter()
    ids = {s["span_id"]: s for s in spans}
    for s in spans:
        p = ids.get(s["parent_span_id"])
        if p:
            nest[(p["name"], s["name"])] += 1
    print("nesting (parent > child):", dict(nest.most_common(8)))
    print("launches by the layers above them:", dict(chains(spans).most_common(6)))
    python_over = [(ids[s["parent_span_id"]]["attributes"].get("code.function.name"), s["name"])
                   for s in spans if s["attributes"].get("eacgm.layer") == "torch" and s["parent_span_id"] in ids
                   and ids[s["parent_span_id"]]["attributes"].get("eacgm.layer") == "python"]
    print("python frame > operator (top):", collections.Counter(python_over).most_common(8))
    if spans_out is not None:
        with gzip.open(spans_out.with_name(f"{spans_out.name}.{layer}.json.gz"), "wt") as f:
            json.dump(spans, f)
    print("resource:", spans[0]["resource"] if spans else None)
    print_metrics(store.metric_points())
    server.stop(0)


def print_metrics(points: list[dict]) -> None:
    """The agent's metrics as exported: last value of every series, GPU and call statistics first."""
    last: dict[tuple, dict] = {}
    for p in points:
        key = (p["name"], tuple(sorted(p["attributes"].items())))
        if key not in last or p["time"] >= last[key]["time"]:
            last[key] = p
    names = collections.Counter(name for name, _ in last)
    print(f"\nmetrics: {len(names)} names, {len(last)} series")
    print("| metric | series | example attributes | value |")
    print("|---|---|---|---|")
    for name in sorted(names, key=lambda n: (not n.startswith("hw."), n)):
        example = next(p for (n, _), p in last.items() if n == name)
        attrs = {k: v for k, v in example["attributes"].items() if not k.startswith("hw.") or k in ("hw.id", "hw.gpu.task", "hw.state", "hw.type")}
        print(f"| {name} | {names[name]} | {str(attrs)[:140]} | {str(example['value'])[:60]} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--layers", default="cuda.driver,cuda.runtime")
    ap.add_argument("--spans-out", type=Path, help="also write every span as JSON to SPANS_OUT.<layer>.json.gz")
    args, extra = ap.parse_known_args()
    for layer in args.layers.split(","):
        run(layer, args.python, args.steps, extra, args.spans_out)


if __name__ == "__main__":
    main()
