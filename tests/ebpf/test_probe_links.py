"""Probe groups on real uprobes, both ways the agent attaches them: uprobe_multi links (kernel
6.6+) and one perf event per probe. A detached group stops counting, a re-attached one counts
again, and an agent forced onto perf events still captures every call."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from agent_run import WORKLOAD, run_traced, summary
from otel_eacgm.bpf_program import CallProgram, ProgramOptions, Sampling, Tail
from otel_eacgm.probe_links import Group, GroupKind, Probe, ProbeLinks
from otel_eacgm.probes.catalog import CATALOG

pytestmark = pytest.mark.ebpf

LAUNCH_SLOT = next(i for i, s in enumerate(CATALOG) if s.symbol == "cudaLaunchKernel")
N = 40


def kernel_has_uprobe_multi() -> bool:
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    return (major, minor) >= (6, 6)


def libcudart() -> str:
    """The real libcudart of the nvidia-cuda-runtime wheel."""
    import nvidia.cu13  # noqa: PLC0415

    return os.path.join(list(nvidia.cu13.__path__)[0], "lib", "libcudart.so.13")


def launches(n: int) -> int:
    """Run the ctypes workload making n cudaLaunchKernel calls; returns its pid."""
    out = subprocess.run([sys.executable, WORKLOAD, json.dumps([["cudaLaunchKernel", n]])], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return json.loads(out.splitlines()[-1])["tid"]


@pytest.mark.parametrize("multi", [True, False], ids=["uprobe_multi", "perf_events"])
def test_a_detached_group_stops_counting_and_counts_again_once_reattached(multi: bool) -> None:
    program = CallProgram(ProgramOptions(filter_pids=False, uprobe_multi=multi))
    links = ProbeLinks(program)
    try:
        assert links.multi_links == (multi and kernel_has_uprobe_multi())
        program.configure(LAUNCH_SLOT, CATALOG[LAUNCH_SLOT])
        program.set_sampling(Sampling(ratio=0.0, slow_s=10.0, slice_s=1.0, resample_s=0.01, salt=1, statistics=True,
                                     slice_max=0))
        lib = libcudart()
        offset = program.resolve(lib, "cudaLaunchKernel")
        links.attach(Group(GroupKind.LAUNCH, lib), [Probe(offset, Tail.ENTRY, LAUNCH_SLOT)])
        assert links.probe_count == 1

        def counted(pid: int) -> int:
            return sum(s.count for s in program.call_stats() if s.pid == pid and s.probe_id == LAUNCH_SLOT)

        assert counted(launches(N)) == N
        assert links.detach(GroupKind.LAUNCH).probes == 1
        assert counted(launches(N)) == 0
        assert links.reattach(GroupKind.LAUNCH) == 1
        assert counted(launches(N)) == N
    finally:
        links.release()
        program.close()


def test_an_agent_on_perf_events_captures_every_call(pipeline) -> None:  # noqa: ANN001
    plan = [["cudaMalloc", 2], ["cudaLaunchKernel", 5], ["ncclAllReduce", 3]]
    proc, calls = run_traced(pipeline.grpc_endpoint, plan, "--launch-layer", "cuda.runtime",
                             env={"OTEL_EACGM_UPROBE_MULTI": "false", "OTEL_EACGM_LOG_LEVEL": "info"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert " (0 links, " in proc.stderr, proc.stderr[-2000:]  # its probes were released as perf events
    assert summary(proc.stderr)["calls"] == len(calls) == 10
    pid = calls[0]["tid"]
    assert pipeline.store.wait_for(
        lambda: len([s for s in pipeline.store.spans() if s["attributes"].get("process.pid") == pid]) >= 10, 30)


@pytest.mark.skipif(not kernel_has_uprobe_multi(), reason="uprobe_multi links need kernel 6.6+")
def test_a_probe_another_tool_holds_is_left_out_of_the_link_and_of_the_count() -> None:
    """Another tool's uprobe on cudaLaunchKernel with a USDT semaphore offset (as BCC 0.26's
    attach_uprobe leaves one) makes the kernel refuse our link at that instruction; the other
    probe of the group is linked on its own, and only it is counted and re-attached."""
    lib = libcudart()
    other = CallProgram(ProgramOptions(filter_pids=False, uprobe_multi=False))
    ours = CallProgram(ProgramOptions(filter_pids=False, uprobe_multi=True))
    other_links, our_links = ProbeLinks(other), ProbeLinks(ours)
    try:
        launch, sync = other.resolve(lib, "cudaLaunchKernel"), other.resolve(lib, "cudaStreamSynchronize")
        other.configure(LAUNCH_SLOT, CATALOG[LAUNCH_SLOT])
        other_links.attach(Group(GroupKind.LAUNCH, lib), [Probe(launch, Tail.ENTRY, LAUNCH_SLOT, ref_ctr_offset=0x6)])
        ours.configure(LAUNCH_SLOT, CATALOG[LAUNCH_SLOT])
        group = Group(GroupKind.LAUNCH, lib)
        our_links.attach(group, [Probe(launch, Tail.ENTRY, LAUNCH_SLOT), Probe(sync, Tail.ENTRY, LAUNCH_SLOT)])
        assert our_links.probe_count == 1
        assert our_links.detach(GroupKind.LAUNCH).probes == 1
        assert our_links.reattach(GroupKind.LAUNCH) == 1
    finally:
        our_links.release()
        ours.close()
        other_links.release()
        other.close()
