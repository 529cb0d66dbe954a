"""A process's own CPU time and memory, from /proc, as the agent benchmarks sample them."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20


@dataclasses.dataclass(frozen=True)
class ProcStat:
    """One sample: `state` (Z once it exited and awaits its parent: its CPU counters are final),
    `cpu_s` (utime + stime of all its threads) and `rss_mib` (0 for a zombie)."""

    state: str
    cpu_s: float
    rss_mib: float


def proc_stat(pid: int) -> ProcStat | None:
    """`pid`'s sample, zombie or alive; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return ProcStat(fields[0], (int(fields[11]) + int(fields[12])) / _TICK, int(fields[21]) * _PAGE_MIB)


def peak_rss_mib(pid: int) -> float | None:
    """The most memory `pid` has held (VmHWM), None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    found = re.search(r"^VmHWM:\s+(\d+)", status, re.M)
    return int(found[1]) / 1024 if found else 0.0
