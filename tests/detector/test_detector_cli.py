"""`otel-eacgm detector fit/score` end to end through main(argv)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
from google.protobuf import json_format

from eacgm_detector.cli import main
from eacgm_detector.persist import load_model
from recording import recording


def write_csv(path, X, names, stamps=None):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow((["timestamp"] if stamps is not None else []) + names)
        for i, row in enumerate(X):
            cells = ["" if np.isnan(v) else repr(float(v)) for v in row]
            w.writerow(([stamps[i]] if stamps is not None else []) + cells)


def test_fit_and_score_csv(tmp_path):
    rng = np.random.default_rng(0)
    names = ["latency", "gpu_util", "net_rate"]
    train = rng.normal(size=(600, 3)) @ np.array([[1, 0.5, 0], [0, 1, 0.3], [0, 0, 1]])
    train[rng.random(600) < 0.05, 1] = np.nan
    write_csv(tmp_path / "train.csv", train, names, stamps=list(range(600)))
    assert main(["fit", "--input", str(tmp_path / "train.csv"), "--output", str(tmp_path / "m.npz")]) == 0
    assert load_model(tmp_path / "m.npz").feature_names == names

    test = rng.normal(size=(100, 3)) @ np.array([[1, 0.5, 0], [0, 1, 0.3], [0, 0, 1]])
    test[[10, 50], 0] += 15.0
    # Columns in another order, without a timestamp: matched by name.
    write_csv(tmp_path / "test.csv", test[:, ::-1], names[::-1])
    assert main(["score", "--model", str(tmp_path / "m.npz"), "--input", str(tmp_path / "test.csv"),
                 "--output", str(tmp_path / "scores.csv")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "scores.csv")))
    assert len(rows) == 100 and set(rows[0]) == {"score", "anomaly"}
    flagged = [i for i, r in enumerate(rows) if r["anomaly"] == "1"]
    assert {10, 50} <= set(flagged) and len(flagged) <= 3
    threshold = load_model(tmp_path / "m.npz").detector.threshold_
    assert all((float(r["score"]) < threshold) == (r["anomaly"] == "1") for r in rows)


def test_fit_from_recorded_otlp_jsonl(tmp_path):
    path = tmp_path / "run.jsonl"
    with open(path, "w") as fh:
        for req in recording([0, 1], 40):
            fh.write(json.dumps(json_format.MessageToDict(req)) + "\n")
    out = tmp_path / "m.npz"
    assert main(["fit", "--input", str(path), "--output", str(out), "--window-s", "1"]) == 0
    names = load_model(out).feature_names
    assert "span.nccl.ncclAllReduce.log_bandwidth" in names
    assert "metric.hw.gpu.utilization.mean" in names


def test_errors_exit_2_and_name_the_problem(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n3,oops\n")
    assert main(["fit", "--input", str(bad), "--output", str(tmp_path / "m.npz")]) == 2
    assert "bad.csv:3" in capsys.readouterr().err
    assert main(["score", "--model", str(bad), "--input", str(bad), "--output", str(tmp_path / "o")]) == 2


def test_python_dash_m_entry_point():
    out = subprocess.run([sys.executable, "-m", "eacgm_detector", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "fit" in out.stdout and "score" in out.stdout
