"""Probes scoped to the traced processes (`scoped_probes`, on with --pid/--cgroup/-- COMMAND).

Real uprobe_multi links on the real libcudart of the wheel, a real agent and Collector. Whether
a process takes a trap is read from its own memory: where the kernel has placed a breakpoint,
the function's first instruction in that process differs from the library file's (an int3); a
process without one never traps there. No timing: counts and bytes only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_run import PYTHON, REPO, WORKLOAD, agent_cmd, summary
from otel_eacgm.probes.elf import ElfFile

pytestmark = pytest.mark.ebpf

FORKING = str(REPO / "tests/workloads/forking_calls.py")
CALLS = 25


def cudart() -> str:
    import nvidia.cu13  # noqa: PLC0415

    return os.path.realpath(Path(list(nvidia.cu13.__path__)[0]) / "lib" / "libcudart.so.13")


def file_offset(path: str, symbol: str) -> int:
    with ElfFile(path) as elf:
        vaddr = elf.symbol(symbol)
        assert vaddr is not None, symbol
        return elf.file_offset(vaddr)


def probed(pid: int, path: str, symbol: str) -> bool:
    """Whether `pid`'s copy of `symbol` carries a breakpoint: its first byte differs from the file's."""
    offset = file_offset(path, symbol)
    with open(path, "rb") as f:
        f.seek(offset)
        on_disk = f.read(1)
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5] == path:
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            start = int(fields[2], 16)
            if start <= offset < start + hi - lo:
                with open(f"/proc/{pid}/mem", "rb") as mem:
                    mem.seek(lo + offset - start)
                    return mem.read(1) != on_disk
    raise AssertionError(f"pid {pid} does not map {symbol} of {path}")


class Agent:
    """`otel-eacgm agent` in the background, its stderr collected."""

    def __init__(self, endpoint: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(agent_cmd(endpoint, "--launch-layer", "cuda.runtime", *args), stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, "OTEL_EACGM_LOG_LEVEL": "debug", **(env or {})})
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stderr.readline, "")), daemon=True).start()

    def log(self) -> str:
        return "".join(self.lines)

    def wait_for(self, needle: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(needle in line for line in list(self.lines)):
            assert time.monotonic() < deadline and self.proc.poll() is None, f"no {needle!r}:\n{self.log()[-4000:]}"
            time.sleep(0.05)

    def links(self) -> int:
        """The agent's open uprobe_multi link fds."""
        n = 0
        for fd in Path(f"/proc/{self.proc.pid}/fd").iterdir():
            try:
                n += os.readlink(fd) == "anon_inode:bpf_link"
            except OSError:
                pass
        return n

    def stop(self) -> dict[str, int]:
        self.proc.terminate()
        self.proc.wait(60)
        time.sleep(0.2)
        return summary(self.log())


def waiting_workload(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    """forking_calls.py with libcudart loaded, waiting for its go file."""
    go = tmp_path / f"go-{len(list(tmp_path.iterdir()))}"
    proc = subprocess.Popen([PYTHON, FORKING, *args], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, EACGM_WAIT_FILE=str(go), EACGM_EXIT_FILE=f"{go}.exit"))
    assert json.loads(proc.stdout.readline())["ready"] == proc.pid
    return proc, go


def calls_made(proc: subprocess.Popen, go: Path) -> dict:
    """Let the workload make its calls; its pids, once done (it then waits for finish())."""
    go.touch()
    return json.loads(proc.stdout.readline())


def finish(proc: subprocess.Popen, go: Path) -> dict:
    pids = calls_made(proc, go)
    Path(f"{go}.exit").touch()
    assert proc.wait(120) == 0
    return pids


def spans_of(store, pid: int) -> int:  # noqa: ANN001
    return len([s for s in store.spans() if s["attributes"].get("process.pid") == pid and s["name"] == "cudaFree"])


@pytest.fixture
def cgroup() -> Iterator[Path]:
    root = Path("/sys/fs/cgroup/unified")
    if not (root / "cgroup.procs").exists():
        pytest.skip("no cgroup v2 hierarchy at /sys/fs/cgroup/unified")
    path = root / f"eacgm-scoped-{os.getpid()}"
    path.mkdir()
    try:
        yield path
    finally:
        for pid in (path / "cgroup.procs").read_text().split():
            (root / "cgroup.procs").write_text(pid)
        path.rmdir()


@pytest.mark.parametrize("scoped", [True, False], ids=["scoped", "file_wide"])
def test_a_neighbour_outside_the_scope_carries_no_breakpoint_and_sends_nothing(pipeline, tmp_path: Path,
                                                                                 scoped: bool) -> None:  # noqa: ANN001
    target, target_go = waiting_workload(tmp_path, str(CALLS), "0", "0")
    neighbour, neighbour_go = waiting_workload(tmp_path, str(CALLS), "0", "0")
    lib = cudart()
    agent = Agent(pipeline.grpc_endpoint, "--pid", str(target.pid),
                  env={"OTEL_EACGM_SCOPED_PROBES": str(scoped).lower()})
    try:
        agent.wait_for("attached ")
        agent.wait_for(" ready: ")
        assert probed(target.pid, lib, "cudaFree")
        # The check can fail: with file-wide probes the neighbour's copy carries the breakpoint too.
        assert probed(neighbour.pid, lib, "cudaFree") is not scoped
        assert probed(neighbour.pid, lib, "cudaMalloc") is not scoped
        mine, theirs = finish(target, target_go)["parent"], finish(neighbour, neighbour_go)["parent"]
        assert pipeline.store.wait_for(lambda: spans_of(pipeline.store, mine) == CALLS, 30), agent.log()[-3000:]
    finally:
        counters = agent.stop()
    assert spans_of(pipeline.store, theirs) == 0
    assert counters["calls"] == CALLS  # the neighbour's calls never reached the BPF program either


def test_children_forked_or_spawned_after_start_are_traced_from_their_first_call(pipeline, tmp_path: Path) -> None:  # noqa: ANN001
    workload, go = waiting_workload(tmp_path, str(CALLS), "3", "1")
    agent = Agent(pipeline.grpc_endpoint, "--pid", str(workload.pid), env={"OTEL_EACGM_SCAN_INTERVAL_S": "0.5"})
    try:
        agent.wait_for(f"for pid {workload.pid}")
        parent_links = agent.links()
        pids = calls_made(workload, go)
        family = [pids["parent"], *pids["forked"], *pids["spawned"]]
        assert pipeline.store.wait_for(lambda: all(spans_of(pipeline.store, p) >= CALLS for p in family), 30), \
            ({p: spans_of(pipeline.store, p) for p in family}, agent.log()[-4000:])
        # Every child was linked, then its links closed once it had exited: none leak.
        for pid in [*pids["forked"], *pids["spawned"]]:
            assert f"for pid {pid}" in agent.log()
        deadline = time.monotonic() + 10
        while agent.links() != parent_links and time.monotonic() < deadline:
            time.sleep(0.1)
        assert agent.links() == parent_links, agent.log()[-3000:]
        Path(f"{go}.exit").touch()
        workload.wait(60)
    finally:
        counters = agent.stop()
    assert {p: spans_of(pipeline.store, p) for p in family} == {p: CALLS for p in family}
    assert counters["calls"] == CALLS * len(family)


def test_a_process_that_joins_the_cgroup_later_is_traced(pipeline, tmp_path: Path, cgroup: Path) -> None:  # noqa: ANN001
    joiner, joiner_go = waiting_workload(tmp_path, str(CALLS), "1", "0")
    outsider, outsider_go = waiting_workload(tmp_path, str(CALLS), "0", "0")
    agent = Agent(pipeline.grpc_endpoint, "--cgroup", str(cgroup), env={"OTEL_EACGM_SCAN_INTERVAL_S": "0.5"})
    try:
        agent.wait_for(" ready: ")
        assert not probed(joiner.pid, cudart(), "cudaFree")
        (cgroup / "cgroup.procs").write_text(str(joiner.pid))
        agent.wait_for(f"for pid {joiner.pid}")
        assert probed(joiner.pid, cudart(), "cudaFree")
        assert not probed(outsider.pid, cudart(), "cudaFree")
        pids = finish(joiner, joiner_go)
        theirs = finish(outsider, outsider_go)["parent"]
        family = [pids["parent"], *pids["forked"]]
        assert pipeline.store.wait_for(lambda: all(spans_of(pipeline.store, p) >= CALLS for p in family), 30), \
            agent.log()[-3000:]
    finally:
        counters = agent.stop()
    assert {p: spans_of(pipeline.store, p) for p in family} == {p: CALLS for p in family}
    assert spans_of(pipeline.store, theirs) == 0
    assert counters["calls"] == CALLS * len(family)


def test_a_new_cgroup_member_that_loads_the_library_is_traced_from_its_first_call(pipeline, tmp_path: Path,
                                                                                  cgroup: Path) -> None:  # noqa: ANN001
    """No scan comes to its rescue (one a minute): the library-open watch finds the member by its
    cgroup, stops it on the open until linked, and every call is traced."""
    load = tmp_path / "load"
    plan = json.dumps([["cudaFree", CALLS]])
    member = subprocess.Popen([PYTHON, WORKLOAD, plan], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, EACGM_LOAD_FILE=str(load)))
    agent = Agent(pipeline.grpc_endpoint, "--cgroup", str(cgroup), env={"OTEL_EACGM_SCAN_INTERVAL_S": "60"})
    try:
        agent.wait_for(" ready: ")
        (cgroup / "cgroup.procs").write_text(str(member.pid))
        load.touch()
        member.communicate(timeout=60)
        assert member.returncode == 0
        assert f"for pid {member.pid}" in agent.log()
        assert pipeline.store.wait_for(lambda: spans_of(pipeline.store, member.pid) >= CALLS, 30), agent.log()[-3000:]
    finally:
        counters = agent.stop()
    assert spans_of(pipeline.store, member.pid) == CALLS
    assert counters["calls"] == CALLS


def test_a_link_made_before_an_exec_fires_in_the_program_executed() -> None:
    """The kernel property the exec path relies on: a link names the task, and its filter reads
    the task's memory at the time, so a process linked before it executes a program that maps
    the library is traced in that program (here a shell that becomes Python loading libcudart)."""
    from otel_eacgm.bpf_program import CallProgram, ProgramOptions, Sampling, Tail  # noqa: PLC0415
    from otel_eacgm.probe_links import Group, GroupKind, Probe, ProbeLinks  # noqa: PLC0415
    from otel_eacgm.probes.catalog import CATALOG  # noqa: PLC0415

    slot = next(i for i, s in enumerate(CATALOG) if s.symbol == "cudaFree")
    program = CallProgram(ProgramOptions(filter_pids=False))
    links = ProbeLinks(program)
    try:
        program.configure(slot, CATALOG[slot])
        program.set_sampling(Sampling(ratio=0.0, slow_s=10.0, slice_s=1.0, resample_s=0.01, salt=1, statistics=True,
                                      slice_max=0))
        lib = cudart()
        code = f"import ctypes; rt = ctypes.CDLL({lib!r}); [rt.cudaFree(ctypes.c_void_p(0x7000)) for _ in range({CALLS})]"
        shell = subprocess.Popen(["sh", "-c", f'read go; exec {PYTHON} -c "{code}"'], stdin=subprocess.PIPE)
        offset = program.resolve(lib, "cudaFree")
        links.attach(Group(GroupKind.CALLS, lib, shell.pid), [Probe(offset, Tail.ENTRY, slot),
                                                              Probe(offset, Tail.RETURN, slot, retprobe=True)])
        shell.communicate(b"go\n", timeout=60)
        assert shell.returncode == 0
        assert {s.pid: s.count for s in program.call_stats() if s.probe_id == slot} == {shell.pid: CALLS}
    finally:
        links.release()
        program.close()


def test_a_fork_is_held_until_continued_and_never_once_the_agent_is_ending() -> None:
    """The hold itself (bpf/calls/process.bpf.h): a traced process's child stops at its birth and
    is announced; once the agent is ending (stop_holding) a child is announced but not stopped,
    since no one would continue it."""
    from otel_eacgm.bpf_program import CallProgram, ProgramOptions  # noqa: PLC0415
    from otel_eacgm.events import EventType, decode  # noqa: PLC0415

    forker = subprocess.Popen([PYTHON, "-c", "import os, sys, time\nfor line in sys.stdin:\n    pid = os.fork()\n"
                               "    if pid == 0:\n        time.sleep(1.0)\n        os._exit(0)\n"
                               "    print(pid, flush=True)\n    os.waitpid(pid, 0)\n"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    program = CallProgram(ProgramOptions(filter_pids=True, hold_forks=True))
    held: list[int] = []
    program.open_ring(lambda records: held.extend(rec.pid for kind, rec in map(decode, records)
                                                  if kind is EventType.FORK_HELD))
    try:
        program.add_target(forker.pid)

        def fork() -> tuple[int, str]:
            forker.stdin.write("\n")
            forker.stdin.flush()
            child = int(forker.stdout.readline())
            deadline = time.monotonic() + 10
            while child not in held and time.monotonic() < deadline:
                program.poll(100)
            time.sleep(0.2)
            return child, Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]

        child, state = fork()
        assert child in held and state == "T"
        os.kill(child, signal.SIGCONT)
        program.stop_holding()
        child, state = fork()
        assert child in held and state in ("S", "R")
    finally:
        forker.stdin.close()
        forker.wait(30)
        program.close()
