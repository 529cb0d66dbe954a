"""The hold guard: continues the processes the agent stopped, if the agent dies first.

With probes scoped to processes the kernel stops a traced process's new child, and with gated
opens a process opening a watched library, until the agent has linked their probes and sends
SIGCONT (bpf/calls/process.bpf.h, library_open.bpf.h). An agent that is killed (SIGKILL, the
OOM killer) or crashes in between never sends it, and the user's process would stay stopped
for good. The kernel writes each such process to the `held` map before stopping it, and the
agent strikes it off when it lets it go (CallProgram.let_go). The guard is a small process of
its own that holds only that map: it waits for the agent to exit, however it exits, and then
continues every process still on the list and still stopped. After a clean exit the list is
empty and the guard exits at once. It lives in a session of its own, so a Ctrl-C at the
terminal reaches the agent, not it; `systemctl stop` ends both (the agent cleanly first).

usage (started by the agent): python -m otel_eacgm.hold_guard AGENT_PID MAP_FD
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from otel_eacgm.procfs import stat_fields

SETTLE_S = 0.05
"""After the agent's exit, time for a stop already under way on another CPU to be written: the
agent's probe links were closed before its exit was signalled, so no new stop begins."""


def start(map_fd: int) -> subprocess.Popen:
    """The guard of this process (the agent) over the held map `map_fd`."""
    return subprocess.Popen([sys.executable, "-m", "otel_eacgm.hold_guard", str(os.getpid()), str(map_fd)],
                            pass_fds=(map_fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            start_new_session=True)


def stopped(pid: int) -> bool:
    """Whether `pid` is in the stopped state (T), as a held process is."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] == "T"


def continue_left(agent_pid: int, map_fd: int) -> list[int]:
    """Continue the held processes the agent left stopped; the pids continued."""
    continued = []
    from otel_eacgm.bpf_program import u32_map_keys  # the BCC boundary, imported once there is work

    for pid in u32_map_keys(map_fd):
        if stopped(pid):
            try:
                os.kill(pid, signal.SIGCONT)
                continued.append(pid)
            except ProcessLookupError:
                pass
    if continued:
        print(f"otel-eacgm hold guard: the agent (pid {agent_pid}) exited while {len(continued)} process(es) "
              f"were stopped for it; continued them: {' '.join(map(str, continued))}", file=sys.stderr, flush=True)
    return continued


def main(argv: Sequence[str]) -> int:
    """Wait for the agent to exit, then continue what it left stopped."""
    agent_pid, map_fd = int(argv[0]), int(argv[1])
    try:
        pidfd = os.pidfd_open(agent_pid)
    except ProcessLookupError:  # gone already: nothing to wait for
        pidfd = None
    if pidfd is not None:
        select.select([pidfd], [], [])
    time.sleep(SETTLE_S)
    continue_left(agent_pid, map_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
