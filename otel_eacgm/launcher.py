"""Launching the command `agent -- COMMAND` traces, so that its very first call is traced.

The child waits on a pipe until its pid is a target and its libraries are scanned. It first
says it runs: Popen returns once the exec has begun, and until the kernel has set up the new
image /proc/PID/environ reads empty (the resource would then lack the command's
OTEL_SERVICE_NAME for good) and /proc/PID/maps lacks the interpreter.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)


class Launcher:
    """The launched command: started held, released, signalled, and its exit status."""

    def __init__(self, command: Sequence[str]) -> None:
        self.command = list(command)
        self._child: subprocess.Popen[bytes] | None = None

    def start(self, before_release: Callable[[int], None]) -> int:
        """Start the command held; run `before_release(pid)` (make it a target, scan it), then
        let it go on; returns its pid."""
        r, w = os.pipe()
        running_r, running_w = os.pipe()
        waiter = (f"import os, sys; os.close({running_w}); os.read({r}, 1); os.close({r}); "
                  f"os.execvp(sys.argv[1], sys.argv[1:])")
        self._child = subprocess.Popen([sys.executable, "-S", "-c", waiter, *self.command],
                                       pass_fds=(r, running_w))
        os.close(r)
        os.close(running_w)
        os.read(running_r, 1)  # end of file once the waiter closed its end, or died
        os.close(running_r)
        before_release(self._child.pid)
        os.write(w, b"go\n")
        os.close(w)
        log.info("launched pid %d: %s", self._child.pid, " ".join(self.command))
        return self._child.pid

    @property
    def pid(self) -> int | None:
        """The command's pid once started."""
        return self._child.pid if self._child is not None else None

    def forward(self, signum: int, _frame: object) -> None:
        """Signal handler: pass SIGINT/SIGTERM on to the command, which decides when it ends."""
        if self._child is not None and self._child.poll() is None:
            self._child.send_signal(signum)

    def install_signal_handlers(self) -> None:
        """Forward SIGINT and SIGTERM to the command."""
        signal.signal(signal.SIGINT, self.forward)
        signal.signal(signal.SIGTERM, self.forward)

    def exited(self) -> bool:
        """Whether the command has exited."""
        return self._child is not None and self._child.poll() is not None

    def exit_status(self) -> int:
        """The command's exit status as a shell reports it (128+N when killed by signal N)."""
        assert self._child is not None
        code = self._child.wait()
        return 128 - code if code < 0 else code
