"""The agent given what it cannot trace, as a careless user would: a command that is not there or
cannot run, a pid that names no process, a traced pid that exits and is reused by a stranger,
and arguments that must not reach its log."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from agent_run import AGENT, PYTHON, WORKLOAD, agent_cmd, ctrl_c_armed, summary

ENDPOINT = "http://127.0.0.1:9"  # nothing listens: these runs must fail before any export


def agent(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*agent_cmd(ENDPOINT), *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(("command", "status", "says"), [
    (["no-such-command-eacgm"], 127, "no-such-command-eacgm: command not found"),
    (["/nonexistent/eacgm/tool"], 127, "/nonexistent/eacgm/tool: No such file or directory"),
    (["/tmp"], 126, "/tmp: Is a directory"),
])
def test_a_command_that_cannot_run_exits_as_a_shell_would_in_one_line(command: list[str], status: int,
                                                                        says: str) -> None:
    proc = agent("--", *command)
    assert proc.returncode == status, proc.stderr
    assert proc.stderr.strip() == f"otel-eacgm agent: {says}", proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_file_without_the_execute_bit_exits_126(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    proc = agent("--", str(script))
    assert proc.returncode == 126, proc.stderr
    assert proc.stderr.strip() == f"otel-eacgm agent: {script}: Permission denied"


def free_pid() -> int:
    taken = {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()}
    return next(pid for pid in range(4_000_000, 10, -1) if pid not in taken
                and pid <= int(Path("/proc/sys/kernel/pid_max").read_text()))


def test_a_pid_that_names_no_process_is_refused_at_start() -> None:
    pid = free_pid()
    started = time.monotonic()
    proc = agent("--pid", str(pid))
    assert proc.returncode == 1, proc.stderr
    assert f"--pid {pid}: no such process" in proc.stderr
    assert time.monotonic() - started < 20  # refused, not waited for


@pytest.mark.ebpf
def test_an_exec_that_fails_after_the_check_ends_in_one_line_with_126(pipeline, tmp_path: Path) -> None:  # noqa: ANN001
    """Executable, but no binary and no #! line: the check passes, the exec itself fails
    (ENOEXEC), in the launched waiter, which must end as a shell does, not in a traceback."""
    blob = tmp_path / "not-a-program"
    blob.write_bytes(b"\x00\x01 not an ELF file\n")
    blob.chmod(0o755)
    proc = subprocess.run([*agent_cmd(pipeline.grpc_endpoint), "--", str(blob)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 126, proc.stderr[-2000:]
    assert f"{blob}: Exec format error" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.ebpf
@pytest.mark.parametrize("argv_exported", [False, True], ids=["argv-private", "argv-exported"])
def test_the_launch_log_line_shows_arguments_only_where_argv_is_exported(pipeline, argv_exported: bool) -> None:  # noqa: ANN001
    secret = "--token=EACGM-SECRET-51d2"
    plan = json.dumps([["cudaMalloc", 1]])
    env = dict(os.environ, OTEL_EACGM_LOG_LEVEL="info",
               OTEL_EACGM_RESOURCE_COMMAND_LINE="true" if argv_exported else "false")
    proc = subprocess.run([*agent_cmd(pipeline.grpc_endpoint), "--", PYTHON, WORKLOAD, plan, secret],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    launched = [line for line in proc.stderr.splitlines() if "launched pid" in line]
    assert len(launched) == 1, proc.stderr[-3000:]
    assert (secret in proc.stderr) is argv_exported, launched
    assert PYTHON in launched[0]


def _spawn_at(pid: int, cmd: list[str], tries: int = 20) -> subprocess.Popen | None:
    """Start `cmd` as pid `pid` (root: the next pid the kernel hands out is ns_last_pid + 1);
    None if other processes keep taking it first."""
    for _ in range(tries):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


@pytest.mark.ebpf
def test_a_traced_pid_that_exits_is_not_traced_again_when_a_stranger_reuses_it(pipeline) -> None:  # noqa: ANN001
    sleeper = subprocess.Popen(["sleep", "600"])
    pid = sleeper.pid
    env = dict(os.environ, OTEL_EACGM_LOG_LEVEL="info", OTEL_EACGM_SCAN_INTERVAL_S="0.2")
    agent_proc = subprocess.Popen([*AGENT, "--endpoint", pipeline.grpc_endpoint, "--insecure", "--pid", str(pid),
                                   "--launch-layer", "cuda.runtime"],
                                  stderr=subprocess.PIPE, text=True, env=env)
    stranger = None
    try:
        deadline = time.monotonic() + 60
        lines: list[str] = []
        while not any(" ready: " in line for line in lines):
            assert time.monotonic() < deadline and agent_proc.poll() is None, "".join(lines)
            lines.append(agent_proc.stderr.readline())
        sleeper.kill()
        sleeper.wait()
        stranger = _spawn_at(pid, [PYTHON, WORKLOAD, json.dumps([["cudaMalloc", 3], ["cudaLaunchKernel", 3]])])
        if stranger is None:
            pytest.skip(f"pid {pid} was taken by another process before the stranger could have it")
        out, err = stranger.communicate(timeout=60)
        assert stranger.returncode == 0, err
        assert len([line for line in out.splitlines() if line.startswith("{")]) == 6
        time.sleep(1.0)  # several scans of the agent
    finally:
        agent_proc.terminate()
        _, rest = agent_proc.communicate(timeout=60)
    log = "".join(lines) + rest
    assert summary(log)["calls"] == 0, log[-3000:]
    assert not [s for s in pipeline.store.spans() if s["attributes"].get("process.pid") == pid]


@pytest.mark.parametrize("after_s", [1.0, 2.5])
def test_ctrl_c_while_starting_exits_130_in_one_line(after_s: float) -> None:
    """Ctrl-C during the seconds BCC compiles used to print a KeyboardInterrupt traceback, and
    now and then was swallowed on its way up: the agent then ran the command and exited 0."""
    proc = subprocess.Popen(ctrl_c_armed([*agent_cmd(ENDPOINT), "--", PYTHON, "-c", "pass"]), stderr=subprocess.PIPE,
                            text=True)
    time.sleep(after_s)  # compiling: the BPF program takes several seconds
    proc.send_signal(2)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted while starting" in err, err
    assert "ready:" not in err, err
