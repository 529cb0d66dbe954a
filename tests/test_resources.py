"""Resources of real processes read from /proc: the process' OTEL_RESOURCE_ATTRIBUTES and
OTEL_SERVICE_NAME are honoured, and an interpreter's default service.name names its job."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from otel_eacgm.resources import agent_resource, interpreter_job_name, process_resource, resource_attributes_from

WAIT = "import sys; sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()"


@contextmanager
def running(args: list[str], env: dict[str, str], cwd: Path) -> Iterator[int]:
    """A real process that waits until its stdin closes; yields its pid once it runs."""
    child = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=cwd,
                             env={k: v for k, v in env.items() if not k.startswith("OTEL_")} | env)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        yield child.pid
    finally:
        child.kill()
        child.wait()


@pytest.fixture
def job(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(WAIT + "\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text(WAIT + "\n")
    return tmp_path


def test_an_interpreters_service_name_is_its_script_or_module(job: Path) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    with running([sys.executable, "-u", "-W", "ignore", str(job / "train.py")], base, job) as pid:
        assert process_resource(pid).attributes["service.name"] == "train"
    with running([sys.executable, "-m", "pkg.mod"], base, job) as pid:
        assert process_resource(pid).attributes["service.name"] == "pkg.mod"
    with running([sys.executable, "-c", WAIT], base, job) as pid:  # nothing names the job: the executable does
        res = process_resource(pid).attributes
        assert res["service.name"] == res["process.executable.name"] == os.path.basename(os.path.realpath(sys.executable))
    with running([sys.executable, str(job / "train.py")], base | {"OTEL_SERVICE_NAME": "lm-train"}, job) as pid:
        assert process_resource(pid).attributes["service.name"] == "lm-train"


def test_the_processes_resource_attributes_are_honoured(job: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=ci, team=ml%20infra,process.pid=1,bad,service.name=lm"}
    with running([sys.executable, str(job / "train.py")], env, job) as pid:
        res = process_resource(pid).attributes
    assert res["deployment.environment.name"] == "ci" and res["team"] == "ml infra"
    assert res["service.name"] == "lm"  # from the variable, since OTEL_SERVICE_NAME is unset
    assert res["process.pid"] == pid  # facts the agent knows win over the variable
    assert "bad" not in res


def test_the_agents_own_resource_takes_its_variable_but_keeps_its_name() -> None:
    res = agent_resource("h", {"OTEL_RESOURCE_ATTRIBUTES": "k8s.node.name=n1,service.name=x",
                               "OTEL_SERVICE_NAME": "train"}).attributes
    assert (res["k8s.node.name"], res["service.name"], res["host.name"]) == ("n1", "otel-eacgm-agent", "h")


def test_command_lines_and_variable_parsing() -> None:
    assert interpreter_job_name(["python3", "-X", "dev", "-OO", "a/b/run.py", "--lr", "1"]) == "run"
    assert interpreter_job_name(["/usr/bin/python3.11", "-mtorch.distributed.run", "x.py"]) == "torch.distributed.run"
    assert interpreter_job_name(["python", "-"]) is None and interpreter_job_name(["python"]) is None
    assert interpreter_job_name(["bash", "train.py"]) is None
    assert resource_attributes_from("a=1,,b = x%2Cy ,=z") == {"a": "1", "b": "x,y"}
