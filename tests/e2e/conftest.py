"""The one end-to-end run this folder's tests share (about half a minute: it runs once)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e_stack import Run, pipeline_run


@pytest.fixture(scope="session")
def e2e_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The whole stack run once on the example workload, Jaeger still up."""
    with pipeline_run(tmp_path_factory.mktemp("e2e")) as run:
        yield run
