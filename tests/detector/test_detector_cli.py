"""`otel-eacgm detector fit/score` end to end through main(argv)."""

from __future__ import annotations

import csv
import subprocess
import sys

import numpy as np
import pytest

from eacgm_detector.cli import main
from eacgm_detector.persist import load_model
from eacgm_detector.replay import otlp_json_line
from eacgm_testkit.recording import SEC, T0, recording


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
    model = load_model(tmp_path / "m.npz")
    # The CSV's columns, then each one's deviation from its mean over the previous 10 and 30 rows.
    assert model.base_feature_names == names and model.context_windows == (10, 30)
    assert model.feature_names == names + [f"{n}.dev{k}" for k in (10, 30) for n in names]

    test = rng.normal(size=(100, 3)) @ np.array([[1, 0.5, 0], [0, 1, 0.3], [0, 0, 1]])
    test[[10, 50], 0] += 15.0
    # Columns in another order, without a timestamp: matched by name.
    write_csv(tmp_path / "test.csv", test[:, ::-1], names[::-1])
    assert main(["score", "--model", str(tmp_path / "m.npz"), "--input", str(tmp_path / "test.csv"),
                 "--output", str(tmp_path / "scores.csv")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "scores.csv")))
    assert len(rows) == 100 and list(rows[0]) == ["score", "threshold", "anomaly", "rule"]
    flagged = [i for i, r in enumerate(rows) if r["anomaly"] == "1"]
    assert {10, 50} <= set(flagged) and len(flagged) <= 3
    det = load_model(tmp_path / "m.npz").detector
    scores = [float(r["score"]) for r in rows]
    # Default: every row below the threshold is reported, by the rule "threshold".
    assert all(float(r["threshold"]) == pytest.approx(det.threshold_, rel=1e-5) for r in rows)
    assert [r["rule"] for r in rows] == ["threshold" if s < det.threshold_ else "" for s in scores]
    assert [r["anomaly"] == "1" for r in rows] == [s < det.threshold_ for s in scores]

    # --confirm-windows 2: two rows in a row below the threshold, or one far below it, each
    # row naming the rule that fired.
    assert main(["score", "--model", str(tmp_path / "m.npz"), "--input", str(tmp_path / "test.csv"),
                 "--output", str(tmp_path / "two.csv"), "--confirm-windows", "2"]) == 0
    two = list(csv.DictReader(open(tmp_path / "two.csv")))
    assert all(scores[i] < det.single_threshold_ for i in (10, 50))
    runs = [0]
    for s in scores:
        runs.append(runs[-1] + 1 if s < det.threshold_ else 0)
    expected = ["consecutive" if s < det.threshold_ and run >= 2 else
                "far" if s < det.single_threshold_ else "" for s, run in zip(scores, runs[1:])]
    assert [r["rule"] for r in two] == expected and expected[10] == expected[50] == "far"
    assert [r["anomaly"] == "1" for r in two] == [e != "" for e in expected]


def write_jsonl(path, reqs):
    """OTLP/JSON lines as the collector's file exporter writes them: ids in hex."""
    with open(path, "w") as fh:
        for req in reqs:
            fh.write(otlp_json_line(req))


def test_fit_and_score_recorded_otlp_jsonl(tmp_path):
    write_jsonl(tmp_path / "run.jsonl", recording([0, 1], 150))
    out = tmp_path / "m.npz"
    assert main(["fit", "--input", str(tmp_path / "run.jsonl"), "--output", str(out), "--window-s", "1"]) == 0
    model = load_model(out)
    assert "span.nccl.ncclAllReduce.log_bandwidth" in model.feature_names
    assert "metric.hw.gpu.utilization.mean" in model.feature_names
    assert model.window_s == 1.0

    write_jsonl(tmp_path / "test.jsonl", recording([0, 1], 40, {20: "bandwidth", 30: "gpu"}, seed=99))
    # The model's own window length is used, not the default 10 s.
    assert main(["score", "--model", str(out), "--input", str(tmp_path / "test.jsonl"),
                 "--output", str(tmp_path / "scores.csv")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "scores.csv")))
    assert len(rows) == 2 * 40
    flagged = {(r["entity"], (int(r["timestamp"]) - T0) // SEC) for r in rows if r["anomaly"] == "1"}
    assert {w for _, w in flagged} == {20, 30} and len(flagged) == 4
    top = {(int(r["timestamp"]) - T0) // SEC: r["top_features"] for r in rows if r["anomaly"] == "1"}
    assert "ncclAllReduce" in top[20]
    assert "hw.gpu.utilization" in top[30] or "hw.power" in top[30]


def test_errors_exit_2_and_name_the_problem(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n3,oops\n")
    assert main(["fit", "--input", str(bad), "--output", str(tmp_path / "m.npz")]) == 2
    assert "bad.csv:3" in capsys.readouterr().err
    assert main(["score", "--model", str(bad), "--input", str(bad), "--output", str(tmp_path / "o")]) == 2


def test_python_dash_m_entry_point():
    out = subprocess.run([sys.executable, "-m", "eacgm_detector", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "fit" in out.stdout and "score" in out.stdout


def test_otel_eacgm_detector_subcommand(tmp_path, capsys):
    from otel_eacgm.cli import main as otel_eacgm_main

    rng = np.random.default_rng(1)
    write_csv(tmp_path / "train.csv", rng.normal(size=(200, 2)), ["a", "b"])
    assert otel_eacgm_main(["detector", "fit", "--input", str(tmp_path / "train.csv"),
                            "--output", str(tmp_path / "m.npz"), "--covariance-type", "diag"]) == 0
    assert "(diag)" in capsys.readouterr().out
    assert load_model(tmp_path / "m.npz").detector.covariance_type == "diag"


def test_otlp_json_lines_round_trip_with_hex_ids(tmp_path):
    from eacgm_detector.replay import read_otlp_jsonl  # noqa: PLC0415

    reqs = recording([0], 3)
    span = reqs[0].resource_spans[0].scope_spans[0].spans[0]
    span.parent_span_id = bytes(range(8))
    write_jsonl(tmp_path / "r.jsonl", reqs)
    line = (tmp_path / "r.jsonl").read_text().splitlines()[0]
    assert span.trace_id.hex() in line and bytes(range(8)).hex() in line  # hex, as the OTLP/JSON spec says
    assert list(read_otlp_jsonl(tmp_path / "r.jsonl")) == reqs
