"""Launching the command `agent -- COMMAND` traces, so that its very first call is traced.

The child waits on a pipe until its pid is a target and its libraries are scanned. It first
says it runs: Popen returns once the exec has begun, and until the kernel has set up the new
image /proc/PID/environ reads empty (the resource would then lack the command's
OTEL_SERVICE_NAME for good) and /proc/PID/maps lacks the interpreter.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

#: Exit statuses a shell gives a command it cannot run (POSIX: 127 not found, 126 not executable).
NOT_FOUND, NOT_EXECUTABLE = 127, 126

# The waiter, run as `python -S -c WAITER RUNNING_FD GO_FD COMMAND...`: says it runs, waits for
# "go", then becomes the command; an exec that fails ends it as a shell would, in one line.
_WAITER = """import errno, os, sys
running, go = int(sys.argv[1]), int(sys.argv[2])
os.close(running)
os.read(go, 1)
os.close(go)
try:
    os.execvp(sys.argv[3], sys.argv[3:])
except OSError as exc:
    sys.stderr.write(f"{sys.argv[3]}: {exc.strerror}\\n")
    os._exit(126 if exc.errno in (errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOEXEC) else 127)
"""


class CommandNotRunnable(Exception):
    """The command cannot be executed; `status` is the exit status a shell would give."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def check_runnable(command: Sequence[str]) -> None:
    """Raise CommandNotRunnable unless `command[0]` names an executable file (a path, or a name
    found on PATH), before any probe is loaded for it."""
    name = command[0]
    path = name if "/" in name else shutil.which(name)
    if path is None:
        raise CommandNotRunnable(f"{name}: command not found", NOT_FOUND)
    if not os.path.exists(path):
        raise CommandNotRunnable(f"{name}: No such file or directory", NOT_FOUND)
    if os.path.isdir(path):
        raise CommandNotRunnable(f"{name}: Is a directory", NOT_EXECUTABLE)
    if not os.access(path, os.X_OK):
        raise CommandNotRunnable(f"{name}: Permission denied", NOT_EXECUTABLE)


class Launcher:
    """The launched command: started held, released, signalled, and its exit status.

    `log_arguments`: the launch log line shows the whole argv, not only the executable
    (arguments often carry tokens; on only where argv is exported, resource_command_line).
    """

    def __init__(self, command: Sequence[str], *, log_arguments: bool = False) -> None:
        self.command = list(command)
        self._log_arguments = log_arguments
        self._child: subprocess.Popen[bytes] | None = None

    def start(self, before_release: Callable[[int], None]) -> int:
        """Start the command held; run `before_release(pid)` (make it a target, scan it), then
        let it go on; returns its pid."""
        r, w = os.pipe()
        running_r, running_w = os.pipe()
        self._child = subprocess.Popen([sys.executable, "-S", "-c", _WAITER, str(running_w), str(r), *self.command],
                                       pass_fds=(r, running_w))
        os.close(r)
        os.close(running_w)
        os.read(running_r, 1)  # end of file once the waiter closed its end, or died
        os.close(running_r)
        before_release(self._child.pid)
        os.write(w, b"go\n")
        os.close(w)
        log.info("launched pid %d: %s", self._child.pid,
                 " ".join(self.command) if self._log_arguments else f"{self.command[0]} (arguments not logged)")
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
