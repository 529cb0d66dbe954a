"""Checks, without bpftool, that no uprobe of an agent is left in the kernel.

A uprobe is a breakpoint the kernel writes into every process mapping the probed file: while it
is set, the probed function's first byte reads as int3 (0xcc) through /proc/PID/mem; once the
last holder of the probe closes it, the original byte is back. tracefs lists probes created
through uprobe_events (BCC's fallback when the perf uprobe PMU is missing). A probe outlives an
agent only through a process that still holds its perf event: the agent's own background
releaser (a fork with the agent's command line) or a leaked child.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

INT3 = 0xCC
TRACEFS = Path("/sys/kernel/tracing")


def first_byte(pid: int, address: int) -> int:
    """The byte at `address` in process `pid`, as the process sees it."""
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(address)
        return mem.read(1)[0]


def tracefs_mentions(path: str) -> list[str]:
    """uprobe_events / uprobe_profile lines naming `path`."""
    out = []
    for name in ("uprobe_events", "uprobe_profile"):
        try:
            out += [line for line in (TRACEFS / name).read_text().splitlines() if path in line]
        except OSError:
            pass
    return out


def processes_with_cmdline(cmdline: list[str]) -> list[int]:
    """Live processes whose command line is exactly `cmdline` (an agent and its forks)."""
    want = "\0".join(cmdline).encode() + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if Path(f"/proc/{entry}/cmdline").read_bytes() == want:
                found.append(int(entry))
        except OSError:
            pass
    return found


def perf_event_fds(pid: int) -> int:
    """How many perf-event file descriptors `pid` holds (each attached uprobe is one)."""
    n = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                n += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[perf_event]"
            except OSError:
                pass
    except OSError:
        return 0
    return n


def wait_until_clean(pid: int, addresses: list[int], originals: list[int], agent_cmdline: list[str],
                     library: str, timeout_s: float) -> float:
    """Seconds until the original bytes are back, no agent process is left and tracefs is
    clean; raises AssertionError with what is left when that takes longer than `timeout_s`."""
    start = time.monotonic()
    while True:
        left = {
            "breakpoints": [hex(a) for a, o in zip(addresses, originals) if first_byte(pid, a) != o],
            "agent processes": processes_with_cmdline(agent_cmdline),
            "tracefs": tracefs_mentions(library),
        }
        if not any(left.values()):
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"probes left {timeout_s}s after the agent exited: {left}")
        time.sleep(0.2)
