"""Fault injection for the example workloads: the faults an ML job meets in production, made on
purpose so the agent's spans and the detector's anomalies can be seen.

Each fault is a small class with two hooks that the training and inference loops call:
``before_step`` (host side, where the next batch is produced) and ``after_backward`` (between
the gradients and the optimizer step, where communication happens). They run on CPU torch and
on CUDA alike, and never change GPU settings (clocks, power limits, ECC). GPU contention from a
second process is its own script: ``python examples/faults/gpu_contention.py``.

    python examples/train.py --fault input-stall --fault-every 10
"""

from __future__ import annotations

import argparse

import torch

from faults.base import Fault
from faults.comm_slowdown import CommSlowdown
from faults.input_stall import InputStall
from faults.memory_pressure import MemoryPressure
from faults.straggler import Straggler

FAULTS: dict[str, type[Fault]] = {"input-stall": InputStall, "comm-slowdown": CommSlowdown,
                                  "memory-pressure": MemoryPressure, "straggler": Straggler}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The --fault flags every example workload takes."""
    g = ap.add_argument_group("fault injection (examples/faults/)")
    g.add_argument("--fault", choices=sorted(FAULTS), help="inject this fault")
    g.add_argument("--fault-every", type=int, default=10, metavar="N", help="the fault hits every Nth step")
    g.add_argument("--fault-rank", type=int, metavar="R",
                   help="only rank R is faulty (default every rank; comm-slowdown is always every rank, "
                        "since a collective that one rank skips would hang the others)")


def from_args(args: argparse.Namespace, device: torch.device, rank: int = 0) -> Fault:
    """The fault the flags ask for on this rank (a no-op Fault when none)."""
    if args.fault is None:
        return Fault(every=args.fault_every)
    cls = FAULTS[args.fault]
    if args.fault_rank is not None and args.fault_rank != rank and cls is not CommSlowdown:
        return Fault(every=args.fault_every)
    return cls(every=args.fault_every, device=device)
