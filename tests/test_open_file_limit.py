"""The agent lifts its soft open-file limit to the hard one (systemd gives services 1024)."""

from __future__ import annotations

import resource
import subprocess
import sys


def _limits_after_raise(soft: int, hard: int) -> tuple[int, int]:
    code = ("import resource; from otel_eacgm.agent import raise_open_file_limit; "
            "print(raise_open_file_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))).stdout
    returned, now_soft, now_hard = map(int, out.split())
    assert returned == now_soft
    return now_soft, now_hard


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    assert _limits_after_raise(256, 4096) == (4096, 4096)


def test_a_soft_limit_at_the_hard_one_is_left_alone() -> None:
    assert _limits_after_raise(512, 512) == (512, 512)
