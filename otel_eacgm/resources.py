"""The OpenTelemetry resource of each traced process, read once from /proc.

service.name is the target's own OTEL_SERVICE_NAME when it sets one (so the agent's spans land
next to the application's own telemetry), else its executable name. The environment is read
for those few variables only; command lines and environment values are left out unless the
configuration asks for them (resource_command_line, resource_environment), because they often
carry secrets (tokens in arguments, credentials in variables) that would then travel to every
backend.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.resources import Resource

_CONTAINER_ID = re.compile(r"([0-9a-f]{64})")
_RANK_VARS = {"RANK": "eacgm.rank", "LOCAL_RANK": "eacgm.local_rank", "WORLD_SIZE": "eacgm.world_size"}


def _environ(pid: int, proc: Path) -> dict[str, str]:
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _executable(pid: int, proc: Path) -> str | None:
    try:
        return os.path.basename(os.readlink(proc / str(pid) / "exe"))
    except OSError:
        try:
            return (proc / str(pid) / "comm").read_text().strip() or None
        except OSError:
            return None


def container_id(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The 64-hex container id in the process' cgroup path (docker, containerd, cri-o)."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    match = _CONTAINER_ID.search(text)
    return match.group(1) if match else None


def command_args(pid: int, proc: Path = Path("/proc")) -> list[str] | None:
    """argv of the process (process.command_args), None when unreadable or a kernel thread."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    args = [a.decode(errors="replace") for a in raw.split(b"\0")]
    if args and args[-1] == "":
        args.pop()
    return args or None


def process_resource(pid: int, proc: Path = Path("/proc"), host_name: str | None = None, *,
                     command_line: bool = False, environment: Sequence[str] = ()) -> Resource:
    """Resource attributes for a traced process; what cannot be read is left out.

    `command_line` adds process.command_args, and each name in `environment` that the process
    has adds process.environment_variable.<NAME>: both opt-in, see the module docstring.
    """
    env = _environ(pid, proc)
    exe = _executable(pid, proc)
    attrs: dict[str, object] = {
        "service.name": env.get("OTEL_SERVICE_NAME") or exe or f"pid-{pid}",
        "process.pid": pid,
        "host.name": host_name or socket.gethostname(),
        "telemetry.sdk.name": "otel-eacgm",
        "telemetry.sdk.language": "python",
    }
    if exe:
        attrs["process.executable.name"] = exe
    cid = container_id(pid, proc)
    if cid:
        attrs["container.id"] = cid
    for var, attr in _RANK_VARS.items():
        value = env.get(var, "")
        if value.isdigit():
            attrs[attr] = int(value)
    if command_line:
        args = command_args(pid, proc)
        if args:
            attrs["process.command_args"] = args
    for name in environment:
        if name in env:
            attrs[f"process.environment_variable.{name}"] = env[name]
    return Resource(attrs)  # type: ignore[arg-type]
