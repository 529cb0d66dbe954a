"""GPU contention from a second process: heavy matrix products on the same device, so a job
traced next to it sees its kernels slow down and its step times stretch. On a machine without
a GPU it contends for the CPU instead. It only runs kernels: no GPU setting (clocks, power,
ECC) is touched.

    python examples/faults/gpu_contention.py --seconds 60 &     # beside a training job
    python examples/faults/gpu_contention.py --device cpu --seconds 1 --size 256
"""

from __future__ import annotations

import argparse
import time

import torch


def contend(device: torch.device, seconds: float, size: int) -> int:
    """Run size x size matrix products on `device` for `seconds`; return how many ran."""
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype) / size ** 0.5
    b, c = a.clone(), torch.empty_like(a)
    done, start, report = 0, time.monotonic(), time.monotonic() + 1
    while time.monotonic() - start < seconds:
        for _ in range(8):
            torch.mm(a, b, out=c)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if not done:  # whoever measures the contention starts from here, not from the launch
            print(f"gpu_contention: running on {device}", flush=True)
        done += 8
        if time.monotonic() >= report:
            rate = done * 2 * size ** 3 / (time.monotonic() - start) / 1e12
            print(f"gpu_contention: {done} products on {device}, {rate:.3f} TFLOP/s", flush=True)
            report += 1
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--size", type=int, default=8192, help="matrix size (CPU: use a few hundred)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        print("gpu_contention: no GPU, contending for the CPU instead", flush=True)
    done = contend(device, args.seconds, args.size)
    print(f"gpu_contention: done, {done} products of {args.size}x{args.size} in {args.seconds:g} s", flush=True)


if __name__ == "__main__":
    main()
