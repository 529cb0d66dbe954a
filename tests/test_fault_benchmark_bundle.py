"""The fault benchmark's device workflow: bundles that come back whole, recordings merged."""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from fault_analysis import load_recordings  # noqa: E402
from run_bundle import write_bundle  # noqa: E402


def recorded(folder: Path, *runs: tuple[str, str | None], device: str = "cuda") -> Path:
    """A folder as `fault_detection.py --record-only` leaves it (runs.json only)."""
    folder.mkdir(parents=True)
    (folder / "runs.json").write_text(json.dumps({
        "runs": [{"name": n, "fault": f} for n, f in runs],
        "args": {"device": device, "train_args": "--dim 8", "window_s": 2.0, "metrics_interval_s": "1",
                 "agent_env": []}}))
    return folder


def test_a_small_bundle_is_one_archive_of_the_folder(tmp_path):
    src = recorded(tmp_path / "fd1", ("clean-train", None))
    (src / "runs").mkdir()
    (src / "runs" / "clean-train.spans.jsonl").write_text("{}\n")
    [path] = write_bundle(src, tmp_path / "out" / "fd1.tar.gz")
    assert path == tmp_path / "out" / "fd1.tar.gz"
    with tarfile.open(path) as tar:
        assert {"fd1/runs.json", "fd1/runs/clean-train.spans.jsonl"} <= set(tar.getnames())


def test_a_large_bundle_is_cut_into_parts_that_join_back(tmp_path):
    src = tmp_path / "fd2"
    src.mkdir()
    payload = os.urandom(300_000)  # does not compress
    (src / "big.bin").write_bytes(payload)
    dest = tmp_path / "out" / "fd2.tar.gz"
    dest.parent.mkdir()
    (dest.parent / "fd2.tar.gz.007").write_bytes(b"stale part of an earlier bundle")
    parts = write_bundle(src, dest, part_bytes=100_000)
    assert [p.name for p in parts] == [f"fd2.tar.gz.{i:03d}" for i in range(4)]
    assert all(p.stat().st_size <= 100_000 for p in parts)
    assert not (dest.parent / "fd2.tar.gz.007").exists()
    joined = b"".join(p.read_bytes() for p in parts)
    with tarfile.open(fileobj=io.BytesIO(joined)) as tar:
        assert tar.extractfile("fd2/big.bin").read() == payload


def test_a_bundle_inside_the_folder_it_packs_is_refused(tmp_path):
    with pytest.raises(ValueError, match="inside the folder"):
        write_bundle(tmp_path, tmp_path / "self.tar.gz")


def test_merged_recordings_train_on_the_first_and_hold_out_every_other_clean_run(tmp_path):
    first = recorded(tmp_path / "a" / "fd", ("clean-train", None), ("clean-heldout", None), ("straggler", "straggler"))
    second = recorded(tmp_path / "b" / "fd", ("clean-train", None), ("clean-heldout-1", None), ("clean-heldout-2", None))
    _, runs = load_recordings(first, [second])
    assert [(r["name"], r["role"]) for r in runs] == [
        ("clean-train", "train"), ("clean-heldout", "clean"), ("straggler", "fault"),
        ("fd+/clean-train", "clean"), ("fd+/clean-heldout-1", "clean"), ("fd+/clean-heldout-2", "clean")]
    assert runs[3]["dir"] == str(second / "runs") and runs[3]["file"] == "clean-train"


def test_recordings_of_another_workload_are_not_merged(tmp_path):
    first = recorded(tmp_path / "fd1", ("clean-train", None))
    other = recorded(tmp_path / "fd2", ("clean-train", None), device="cpu")
    with pytest.raises(SystemExit, match="device='cpu'"):
        load_recordings(first, [other])
