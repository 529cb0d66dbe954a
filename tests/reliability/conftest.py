"""Fixtures of the reliability suite: the workload binary, counting sinks, own collectors."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import calls_workload  # noqa: E402
import otlp_counter  # noqa: E402
from collector_proc import CollectorProcess  # noqa: E402


@pytest.fixture(scope="session")
def workload_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/reliability/reliability_calls.c, compiled once per session."""
    return calls_workload.build(tmp_path_factory.mktemp("workload"))


@pytest.fixture
def counter() -> Iterator[tuple[otlp_counter.Counter, int]]:
    """A counting OTLP sink on loopback for this test: (counter, port)."""
    server, sink, port = otlp_counter.serve()
    yield sink, port
    server.stop(0).wait()


@pytest.fixture
def own_collector(counter, tmp_path: Path) -> Iterator[Callable[..., CollectorProcess]]:  # noqa: ANN001
    """Factory of real Collectors exporting to this test's counter; all stopped at the end."""
    started: list[CollectorProcess] = []

    def make(**kwargs) -> CollectorProcess:  # noqa: ANN003
        c = CollectorProcess(counter[1], tmp_path / f"collector{len(started)}.log", **kwargs)
        started.append(c)
        return c.start()

    yield make
    for c in started:
        if c.alive():
            c.stop()
