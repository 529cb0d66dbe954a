"""Bad inputs of `otel-eacgm detector fit/score` (issue 26), through the real CLI process.

A data error is one line on stderr that names the input file (and its line, column or window
where known), exit status 2, no traceback, and no model or score file written.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from eacgm_detector.config import DetectorConfig
from eacgm_detector.model import GMMDetector
from eacgm_detector.online import fit_rows
from eacgm_detector.persist import load_model
from eacgm_detector.replay import otlp_json_line
from eacgm_testkit.recording import SEC, T0, recording

REPO = Path(__file__).resolve().parents[2]
CLI = [str(REPO / ".venv/bin/otel-eacgm"), "detector"]
#: replay.MAX_JSON_DEPTH, written out so that this module imports before the fix too.
MAX_JSON_DEPTH = 256
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING) ")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=300)


def assert_data_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, no traceback, and stderr is log lines plus exactly one error line, naming
    every needle; returns that line."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if not _LOG_LINE.match(ln)]
    assert len(errors) == 1 and errors[0].startswith("otel-eacgm detector "), proc.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]


def write_csv(path: Path, X: np.ndarray, names: list[str]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(names)
        for row in X:
            w.writerow(["" if np.isnan(v) else repr(float(v)) for v in row])
    return path


def normal_table(n: int = 200, d: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, d))


# 1. Values whose float64 statistics overflow -------------------------------------------------

@pytest.mark.parametrize("cell,shown", [("1e308", "1e+308"), ("-1e308", "-1e+308"), ("1e101", "1e+101"),
                                        ("inf", "inf"), ("-Infinity", "-inf")])
def test_fit_refuses_values_beyond_the_limit_naming_file_line_and_column(tmp_path, cell, shown):
    path = write_csv(tmp_path / "huge.csv", normal_table(), ["a", "b", "c"])
    lines = path.read_text().splitlines()
    cells = lines[5].split(",")  # data row 5, line 6 of the file
    cells[1] = cell
    lines[5] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "m.npz"
    err = assert_data_error(run("fit", "--input", path, "--output", out), f"{path}:6", "column 'b'", shown)
    assert "1e+100" in err
    assert not out.exists()


def test_fit_accepts_values_up_to_the_limit(tmp_path):
    X = normal_table()
    X[5, 1] = 1e100
    path = write_csv(tmp_path / "big.csv", X, ["a", "b", "c"])
    proc = run("fit", "--input", path, "--output", tmp_path / "m.npz")
    assert proc.returncode == 0, proc.stderr[-3000:]
    load_model(tmp_path / "m.npz")  # loads: every statistic is finite


def test_score_refuses_values_beyond_the_limit(tmp_path):
    good = write_csv(tmp_path / "train.csv", normal_table(), ["a", "b", "c"])
    assert run("fit", "--input", good, "--output", tmp_path / "m.npz").returncode == 0
    X = normal_table(20, seed=1)
    X[3, 2] = -1e200
    bad = write_csv(tmp_path / "test.csv", X, ["a", "b", "c"])
    assert_data_error(run("score", "--model", tmp_path / "m.npz", "--input", bad, "--output", tmp_path / "s.csv"),
                      f"{bad}:5", "column 'c'")
    assert not (tmp_path / "s.csv").exists()


def test_fit_of_a_recording_refuses_an_overflowing_feature_naming_the_window(tmp_path):
    reqs = recording([0], 30)
    metrics = [r for r in reqs if r.DESCRIPTOR.name == "ExportMetricsServiceRequest"]
    for m in metrics[12].resource_metrics[0].scope_metrics[0].metrics:
        if m.name == "hw.power":
            m.gauge.data_points[0].as_double = 1e300
    path = tmp_path / "run.jsonl"
    path.write_text("".join(otlp_json_line(r) for r in reqs))
    out = tmp_path / "m.npz"
    assert_data_error(run("fit", "--input", path, "--output", out, "--window-s", "1"),
                      str(path), "metric.hw.power", f"{T0 + 12 * SEC}", "1e+100")
    assert not out.exists()


def test_the_model_refuses_training_data_whose_statistics_overflow():
    """The estimator itself never returns a model that its own file format would refuse."""
    X = normal_table()
    X[:100, 1] = 1e300
    with pytest.raises(ValueError, match="feature 1"):
        GMMDetector(max_components=1).fit(X)


# 3. Deeply nested recorded OTLP --------------------------------------------------------------

@pytest.mark.parametrize("depth,opener,closer", [
    (100_000, "[", "]"),            # beyond Python's JSON parser
    (5_000, '{"a":', "}"),          # likewise, objects
    (MAX_JSON_DEPTH + 1, "[", "]"),  # parsed, but deeper than any OTLP request
])
@pytest.mark.parametrize("command", ["fit", "score"])
def test_deeply_nested_json_line_is_refused_with_its_line(tmp_path, command, depth, opener, closer):
    path = tmp_path / "deep.jsonl"
    first = otlp_json_line(recording([0], 1)[0])
    path.write_text(first + '{"resourceSpans": ' + opener * depth + "1" + closer * depth + "}\n")
    if command == "fit":
        proc = run("fit", "--input", path, "--output", tmp_path / "m.npz")
    else:
        write_csv(tmp_path / "t.csv", normal_table(), ["a", "b", "c"])
        assert run("fit", "--input", tmp_path / "t.csv", "--output", tmp_path / "m.npz").returncode == 0
        proc = run("score", "--model", tmp_path / "m.npz", "--input", path, "--output", tmp_path / "s.csv")
    assert_data_error(proc, f"{path}:2", "nested", str(MAX_JSON_DEPTH))


def test_nesting_up_to_the_limit_passes_the_depth_check(tmp_path):
    """A line nested exactly MAX_JSON_DEPTH deep gets past the depth check (this one is then
    no OTLP request, which is another clear error)."""
    path = tmp_path / "deep.jsonl"
    depth = MAX_JSON_DEPTH - 1  # the line's own object is the first level
    path.write_text('{"resourceSpans": ' + "[" * depth + "]" * depth + "}\n")
    err = assert_data_error(run("fit", "--input", path, "--output", tmp_path / "m.npz"), f"{path}:1")
    assert "nested" not in err


# 4. Columns and tables with nothing to learn from ----------------------------------------------

def test_all_nan_column_is_dropped_named_and_ignored_when_scoring(tmp_path):
    X = normal_table(300)
    X[:, 2] = np.nan
    train = write_csv(tmp_path / "train.csv", X, ["a", "b", "idle"])
    proc = run("fit", "--input", train, "--output", tmp_path / "m.npz")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "idle" in proc.stderr and "no value" in proc.stderr and str(train) in proc.stderr
    model = load_model(tmp_path / "m.npz")
    assert model.base_feature_names == ["a", "b"]
    assert not any(n.startswith("idle") for n in model.feature_names)
    # Scoring data that does have the column: it is ignored, not taken for a huge deviation.
    Y = normal_table(100, seed=5)
    Y[:, 2] = np.random.default_rng(6).normal(50, 10, 100)
    test = write_csv(tmp_path / "test.csv", Y, ["a", "b", "idle"])
    proc = run("score", "--model", tmp_path / "m.npz", "--input", test, "--output", tmp_path / "s.csv")
    assert proc.returncode == 0, proc.stderr[-3000:]
    flagged = sum(r["anomaly"] == "1" for r in csv.DictReader(open(tmp_path / "s.csv")))
    assert flagged <= 3


def test_all_nan_table_is_refused(tmp_path):
    path = write_csv(tmp_path / "empty.csv", np.full((100, 3), np.nan), ["a", "b", "c"])
    out = tmp_path / "m.npz"
    assert_data_error(run("fit", "--input", path, "--output", out), str(path), "nothing to learn from")
    assert not out.exists()


def test_fit_rows_drops_features_without_any_value():
    rows = [{"a": float(i % 7), "b": float("nan")} for i in range(50)]
    model = fit_rows(DetectorConfig(max_components=1, context_windows=[]), rows)
    assert model.feature_names == ["a"]
    with pytest.raises(ValueError, match="nothing to learn from"):
        fit_rows(DetectorConfig(max_components=1, context_windows=[]), [{"b": float("nan")}] * 50)


# 5. Every data error names the file, one line, no traceback -------------------------------------

@pytest.mark.parametrize("name,content,needle", [
    ("one_row.csv", b"a,b\n1,2\n", "1 data row"),
    ("no_rows.csv", b"a,b\n", "no data rows"),
    ("no_columns.csv", b"timestamp\n1\n2\n3\n", "no feature columns"),
    ("duplicate.csv", b"a,b,a\n1,2,3\n4,5,6\n", "'a'"),
    ("nul.csv", b"a,b\n1,2\n3\x00,4\n", ":3"),
    ("binary.csv", b"a,b\n1,2\n\xff\xfe,4\n", ":3"),
    ("huge_field.csv", b"a\n" + b"1" * 200_000 + b"\n", ":2"),
    ("number.jsonl", b"5\n", ":1"),
    ("null.jsonl", b"null\n", ":1"),
    ("binary.jsonl", b"\xff\xfe\n", ":1"),
])
def test_fit_data_errors_name_the_file(tmp_path, name, content, needle):
    path = tmp_path / name
    path.write_bytes(content)
    out = tmp_path / "m.npz"
    assert_data_error(run("fit", "--input", path, "--output", out), str(path), needle)
    assert not out.exists()


def test_score_data_errors_name_the_file(tmp_path):
    train = write_csv(tmp_path / "train.csv", normal_table(), ["a", "b", "c"])
    assert run("fit", "--input", train, "--output", tmp_path / "m.npz").returncode == 0
    for name, content, needle in [("nul.csv", b"a,b,c\n1,2,3\n3\x00,4,5\n", ":3"),
                                  ("binary.csv", b"a,b,c\n\xff,2,3\n", ":2"),
                                  ("inf.csv", b"a,b,c\n1,inf,3\n", "column 'b'"),
                                  ("number.jsonl", b"\n5\n", ":2")]:
        path = tmp_path / name
        path.write_bytes(content)
        assert_data_error(run("score", "--model", tmp_path / "m.npz", "--input", path,
                              "--output", tmp_path / "s.csv"), str(path), needle)
        assert not (tmp_path / "s.csv").exists()


def test_score_of_a_table_without_rows_writes_only_the_header(tmp_path):
    train = write_csv(tmp_path / "train.csv", normal_table(), ["a", "b", "c"])
    assert run("fit", "--input", train, "--output", tmp_path / "m.npz").returncode == 0
    (tmp_path / "empty.csv").write_text("a,b,c\n")
    proc = run("score", "--model", tmp_path / "m.npz", "--input", tmp_path / "empty.csv",
               "--output", tmp_path / "s.csv")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "s.csv").read_text().splitlines() == ["score,threshold,anomaly,rule"]


def test_json_error_lines_stay_one_line(tmp_path):
    """A parser message with a newline in it (protobuf's) is still one line on stderr."""
    path = tmp_path / "wrong.jsonl"
    path.write_text(json.dumps({"resourceSpans": [{"nope": 1}]}) + "\n")
    assert_data_error(run("fit", "--input", path, "--output", tmp_path / "m.npz"), f"{path}:1")
