"""`fit` and `score` on a full disk (issue 26): the file already at --output survives.

A real 64 KiB tmpfs holds a good model and a good score file; a fit whose model, and a score
whose table, cannot fit there must fail with a clear error, leave both files byte for byte as
they were (the model still loads) and leave no temporary file behind.
"""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from eacgm_detector.persist import load_model

REPO = Path(__file__).resolve().parents[2]
CLI = [str(REPO / ".venv/bin/otel-eacgm"), "detector"]


def _run(*args) -> subprocess.CompletedProcess:  # noqa: ANN002
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=300)


def _table(path: Path, n: int, d: int, seed: int = 0) -> Path:
    X = np.random.default_rng(seed).normal(size=(n, d))
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([f"f{j}" for j in range(d)])
        w.writerows(X.round(6).tolist())
    return path


@pytest.fixture
def small_disk(tmp_path: Path):  # noqa: ANN201
    """A real 64 KiB tmpfs, unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def _assert_full_disk_error(proc: subprocess.CompletedProcess, path: Path) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("otel-eacgm detector ") and "No space left" in last and str(path) in last, last


def test_full_disk_leaves_the_old_model_and_scores_intact(tmp_path: Path, small_disk: Path) -> None:
    model = small_disk / "model.npz"
    scores = small_disk / "scores.csv"
    small = _table(tmp_path / "small.csv", 200, 3)
    proc = _run("fit", "--input", small, "--output", model)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _run("score", "--model", model, "--input", _table(tmp_path / "few.csv", 20, 3, seed=1),
                "--output", scores)
    assert proc.returncode == 0, proc.stderr[-3000:]
    old_model, old_scores = model.read_bytes(), scores.read_bytes()
    assert len(old_model) < 24 * 1024

    # 40 columns (120 features with context): the model's covariances alone exceed the disk.
    big = _table(tmp_path / "big.csv", 300, 40)
    proc = _run("fit", "--input", big, "--output", model)
    assert model.read_bytes() == old_model
    _assert_full_disk_error(proc, model)
    assert load_model(model).base_feature_names == ["f0", "f1", "f2"]
    assert sorted(os.listdir(small_disk)) == ["model.npz", "scores.csv"]

    # 6000 rows of scores do not fit either.
    many = _table(tmp_path / "many.csv", 6000, 3, seed=2)
    proc = _run("score", "--model", model, "--input", many, "--output", scores)
    assert scores.read_bytes() == old_scores
    _assert_full_disk_error(proc, scores)
    assert sorted(os.listdir(small_disk)) == ["model.npz", "scores.csv"]

    # A new file that cannot fit is not created at all.
    fresh = small_disk / "fresh.npz"
    _assert_full_disk_error(_run("fit", "--input", big, "--output", fresh), fresh)
    assert sorted(os.listdir(small_disk)) == ["model.npz", "scores.csv"]


def test_replacing_an_output_keeps_its_permissions_and_a_symlink(tmp_path: Path) -> None:
    small = _table(tmp_path / "small.csv", 200, 3)
    real = tmp_path / "real.npz"
    assert _run("fit", "--input", small, "--output", real).returncode == 0
    real.chmod(0o640)
    link = tmp_path / "link.npz"
    link.symlink_to(real)
    assert _run("fit", "--input", _table(tmp_path / "other.csv", 200, 2), "--output", link).returncode == 0
    assert link.is_symlink() and (real.stat().st_mode & 0o777) == 0o640
    assert load_model(real).base_feature_names == ["f0", "f1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.npz", "other.csv", "real.npz", "small.csv"]
