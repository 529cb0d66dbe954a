"""High-rate tiny operators are shed through the real probe links while a real PyTorch loop
runs: one log line and the eacgm.agent.operators.shed gauge (through the Collector) name the
shed operator; it stops being probed (its counted calls fall far behind the calls made), while
the slower operator beside it stays probed and counted in full."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from agent_run import REPO, agent_cmd, summary

pytestmark = pytest.mark.ebpf

WORKLOAD = str(REPO / "tests/workloads/torch_tiny_ops.py")


def counted(points: list[dict], pid: int, name: str) -> int:
    """The last cumulative eacgm.calls of `name` (all overloads) in process `pid`."""
    last: dict[tuple, tuple[int, int]] = {}
    for p in points:
        a = p["attributes"]
        if p["name"] == "eacgm.calls" and a.get("process.pid") == pid and a.get("code.function.name") == name:
            key = tuple(sorted(a.items()))
            if key not in last or p["time"] >= last[key][0]:
                last[key] = (p["time"], p["value"])
    return sum(v for _, v in last.values())


def test_a_high_rate_tiny_operator_is_shed_and_said_so(pipeline) -> None:  # noqa: ANN001
    cmd = agent_cmd(pipeline.grpc_endpoint, "--layers", "torch", "--", sys.executable, WORKLOAD, "5")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(
        os.environ, OTEL_EACGM_GPU_METRICS="0", OTEL_EACGM_METRICS_INTERVAL_S="1", OTEL_EACGM_OVERHEAD_BUDGET="0"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    made = json.loads(proc.stdout.splitlines()[-1])
    pid = made["tid"]
    lines = [x for x in proc.stderr.splitlines() if "otel_eacgm.operator_shedding" in x]
    # one line per decision, naming each operator shed with its rate
    assert any("high-rate tiny operators" in x and "aten::add_ (" in x for x in lines), proc.stderr[-3000:]
    assert not any("aten::mm" in x for x in lines), lines
    done = summary(proc.stderr)
    assert done["shed_ops"] == 1
    # the shed operator's calls made between its entry and exit re-links, and the kept operator's
    # returns seen by both exit links while they overlap, come back without entries: in the
    # shed's gap they are cycled_returns, not unmatched_returns. A few unmatched ones may come from
    # the attach itself (a call in flight when a rescan links the library: design.md), as in
    # test_guardrail_operators; before the gap was held here they were thousands, cycled none
    assert done["cycled_returns"] > 0, done
    assert done["unmatched_returns"] <= max(5, done["cycled_returns"] // 20), done

    def gauge() -> dict[str, float]:
        return {p["attributes"]["code.function.name"]: p["value"] for p in pipeline.store.metric_points()
                if p["name"] == "eacgm.agent.operators.shed"}

    assert pipeline.store.wait_for(lambda: "aten::add_" in gauge(), 30), gauge()
    # the gauge says the rate the log line gave when it was shed, a rate whose probes cost at least
    # torch_shed_share (1 %) of a thread; how high it is depends on where in its stats window the
    # loop began, so the rate itself is not pinned
    said = re.search(r"aten::add_ \((\d+) calls/s of [\d.]+ us, probes ([\d.]+)% of a thread\)", "\n".join(lines))
    assert said, lines
    assert abs(gauge()["aten::add_"] - float(said[1])) <= 1.0
    assert float(said[2]) >= 1.0

    def both() -> tuple[int, int]:
        points = pipeline.store.metric_points()
        return counted(points, pid, "aten::add_"), counted(points, pid, "aten::mm")

    assert pipeline.store.wait_for(lambda: both()[1] >= made["products"], 30), (both(), made)
    adds, products = both()
    assert products == made["products"]  # the product is still probed: every call counted
    # re-linked with the old link still live, each product entered twice once: one call, not an
    # unwound one and a second
    errors = [p for p in pipeline.store.metric_points() if p["name"] == "eacgm.call.errors"
              and p["attributes"].get("code.function.name") == "aten::mm"]
    assert not errors, errors
    assert 0 < adds < made["adds"] / 2, (adds, made)  # the add is not probed any more
