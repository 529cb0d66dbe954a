"""The OpenTelemetry resource of each traced process, read once from /proc.

The process' own OpenTelemetry variables are honoured as an SDK in it would: its
OTEL_RESOURCE_ATTRIBUTES (``key=value,...``, values percent-decoded) are the base, and its
OTEL_SERVICE_NAME, when set, is service.name. Without either, service.name is the executable
name, except for interpreters, where that would name every job alike (``python3.11``): for
``python train.py`` it is the script (``train``), for ``python -m pkg.mod`` the module
(``pkg.mod``). What the agent knows for a fact (process.pid, host.name, the executable, ranks,
container id) overrides the variables. The environment is read for those few variables only;
command lines and environment values are left out unless the configuration asks for them
(resource_command_line, resource_environment), because they often carry secrets (tokens in
arguments, credentials in variables) that would then travel to every backend.
"""

from __future__ import annotations

import os
import re
import socket
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.resources import Resource

from otel_eacgm import __version__

_CONTAINER_ID = re.compile(r"([0-9a-f]{64})")
_INTERPRETER = re.compile(r"^(python|pypy)[0-9.]*[a-z]?$")
# CPython options that take a value (the next argument unless attached: -Wignore, -Xdev).
_PYTHON_VALUE_OPTIONS = frozenset("WX")
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


def resource_attributes_from(value: str) -> dict[str, str]:
    """OTEL_RESOURCE_ATTRIBUTES as the SDK reads it: comma-separated key=value pairs, keys and
    values percent-decoded, blanks around them dropped; an entry without ``=`` is skipped."""
    out = {}
    for item in value.split(","):
        key, sep, val = item.partition("=")
        key = urllib.parse.unquote(key.strip())
        if sep and key:
            out[key] = urllib.parse.unquote(val.strip())
    return out


def interpreter_job_name(args: Sequence[str]) -> str | None:
    """The name of the job an interpreter runs: the script's stem (``python train.py`` ->
    ``train``) or the module (``python -m pkg.mod`` -> ``pkg.mod``); None for ``-c``, an
    interactive interpreter, or a command line that is not an interpreter's."""
    if not args or not _INTERPRETER.match(os.path.basename(args[0])):
        return None
    rest = list(args[1:])
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            break
        if not arg.startswith("-") or arg == "-":
            rest.insert(0, arg)
            break
        if arg.startswith("--"):
            continue  # --version, --help: the job is not run; other long options take no value
        for i, flag in enumerate(arg[1:], start=1):
            if flag == "c":
                return None
            if flag == "m":
                module = arg[i + 1:] or (rest.pop(0) if rest else "")
                return module or None
            if flag in _PYTHON_VALUE_OPTIONS:
                if i == len(arg) - 1 and rest:
                    rest.pop(0)
                break
    if not rest or rest[0] == "-":
        return None
    stem = os.path.splitext(os.path.basename(rest[0]))[0]
    return stem or None


def service_name(pid: int, env: dict[str, str], exe: str | None, proc: Path = Path("/proc")) -> str:
    """The traced process' service.name (see the module docstring for the order)."""
    if env.get("OTEL_SERVICE_NAME"):
        return env["OTEL_SERVICE_NAME"]
    named = resource_attributes_from(env.get("OTEL_RESOURCE_ATTRIBUTES", "")).get("service.name")
    if named:
        return named
    if exe and _INTERPRETER.match(exe):
        job = interpreter_job_name(command_args(pid, proc) or [])
        if job:
            return job
    return exe or f"pid-{pid}"


def process_resource(pid: int, proc: Path = Path("/proc"), host_name: str | None = None, *,
                     command_line: bool = False, environment: Sequence[str] = ()) -> Resource:
    """Resource attributes for a traced process; what cannot be read is left out.

    `command_line` adds process.command_args, and each name in `environment` that the process
    has adds process.environment_variable.<NAME>: both opt-in, see the module docstring.
    """
    env = _environ(pid, proc)
    exe = _executable(pid, proc)
    attrs: dict[str, object] = dict(resource_attributes_from(env.get("OTEL_RESOURCE_ATTRIBUTES", "")))
    attrs.update({
        "service.name": service_name(pid, env, exe, proc),
        "process.pid": pid,
        "host.name": host_name or socket.gethostname(),
        "telemetry.sdk.name": "otel-eacgm",
        "telemetry.sdk.language": "python",
    })
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


def agent_resource(host_name: str, environ: dict[str, str] | None = None) -> Resource:
    """The agent's own resource, for its self-telemetry: its OTEL_RESOURCE_ATTRIBUTES, with
    service.name always ``otel-eacgm-agent``. OTEL_SERVICE_NAME is not taken: set in the shell
    that runs ``otel-eacgm agent -- COMMAND``, it names the command, and the agent's figures must
    not land under the application's service."""
    env = os.environ if environ is None else environ
    attrs: dict[str, object] = dict(resource_attributes_from(env.get("OTEL_RESOURCE_ATTRIBUTES", "")))
    attrs.update({"service.name": "otel-eacgm-agent", "host.name": host_name, "process.pid": os.getpid(),
                  "service.version": __version__})
    return Resource(attrs)  # type: ignore[arg-type]
