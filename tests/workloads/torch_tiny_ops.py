"""A test workload: a loop of tiny PyTorch operators at a high rate (in-place adds on a
one-element tensor, a tensor operand: no scalar conversion), with a matrix product now and then, for a few seconds.

Prints one JSON line at the end: how many adds and products it made. usage: torch_tiny_ops.py [SECONDS]
"""

import json
import os
import sys
import time

import torch


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
    torch.set_num_threads(1)
    x, one, a = torch.zeros(1), torch.ones(1), torch.randn(96, 96)
    time.sleep(0.2)  # let the agent finish attaching
    adds = products = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(100):
            x.add_(one)
        adds += 100
        torch.mm(a, a)
        products += 1
    print(json.dumps({"adds": adds, "products": products, "tid": os.getpid()}), flush=True)


if __name__ == "__main__":
    main()
