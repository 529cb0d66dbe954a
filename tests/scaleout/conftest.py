"""The scale-out runs this folder's tests share: one replica and three, fed the same traffic."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scaleout_stack import WINDOWS, Scored, scaleout  # noqa: E402


def _run(log_dir: Path, n: int) -> tuple[dict[tuple[str, str, int], Scored], set]:
    with scaleout(log_dir, n) as stack:
        stack.run_agents(WINDOWS, pace_s=0.1)
        stack.flush()
        assert stack.dropped() == {"traces": 0, "metrics": 0}
        return stack.scored(), stack.anomalies()


@pytest.fixture(scope="session")
def one_replica(tmp_path_factory: pytest.TempPathFactory):
    """(scored windows, anomalies) of the traffic through the gateway to one replica."""
    return _run(tmp_path_factory.mktemp("one-replica"), 1)


@pytest.fixture(scope="session")
def three_replicas(tmp_path_factory: pytest.TempPathFactory):
    """(scored windows, anomalies) of the same traffic through the gateway to three replicas."""
    return _run(tmp_path_factory.mktemp("three-replicas"), 3)
