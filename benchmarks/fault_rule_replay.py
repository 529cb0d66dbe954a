"""A confirmation rule replayed on the per-window scores of recorded GPU fault runs.

``fault_analysis.py`` writes every scored window of the fault benchmark (score, threshold,
single-window threshold, run below) to ``scores/*.csv.gz`` beside its report, so that a
decision rule can be tried after the recordings themselves are gone. This replays one rule
on those files: each window below its model's threshold alone (``confirm_windows`` 1, the
default since 2026-12-07), or the recorded rule (``--confirm-windows 2``: two in a row or
one beyond the single-window threshold), and prints per run the windows flagged and, for a
fault run, the first flagged measured window.

With ``--drift-windows N`` (default 100, as ``serve``) the thresholds follow drift as the
detector's ``DriftThreshold`` moves them, per model and entity, from the median held-out
score that the recorded thresholds imply (the single-window threshold lies three times as far
below it as the threshold: median = (3 threshold - single) / 2); 0 keeps them fixed.

What it cannot replay is a new threshold: that needs the models' held-out scores, which the
files do not hold. The recorded threshold is an upper bound on a Peaks-Over-Threshold
threshold at a smaller risk for the same held-out scores (it moves away from the median as
the risk falls), so the windows flagged here at the recorded threshold include every window
a smaller risk would flag.

    .venv/bin/python benchmarks/fault_rule_replay.py docs/gpu-runs/2026-12-06/scores [--confirm-windows 1]
        [--drift-windows 100]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import sys
from pathlib import Path

from eacgm_detector.drift import DriftThreshold


def replay(path: Path, confirm: int, drift_windows: int = 0) -> tuple[int, int, int | None]:
    """(measured windows, windows flagged, 1-based index of the first flagged measured window)
    of one run's scores file, each model's windows in order."""
    rows = list(csv.DictReader(gzip.open(path, "rt")))
    runs: dict[str, int] = {}
    drifts: dict[tuple[str, str], DriftThreshold] = {}
    starts = sorted({int(r["timestamp"]) for r in rows if r.get("measured", "1") == "1"})
    flagged, first = 0, None
    for r in rows:
        score, thr, single = float(r["score"]), float(r["threshold"]), float(r["single_threshold"])
        drift = drifts.setdefault((r["model"], r["entity"]),
                                  DriftThreshold(thr, single, (3 * thr - single) / 2, drift_windows))
        thr, single = drift.current()
        drift.observe(score, score < thr)
        run = runs[r["model"]] = runs.get(r["model"], 0) + 1 if score < thr else 0
        fired = score < thr and (run >= confirm or (confirm > 1 and score < single))
        if fired and r.get("measured", "1") == "1":
            flagged += 1
            index = starts.index(int(r["timestamp"])) + 1
            first = index if first is None else min(first, index)
    return len(starts), flagged, first


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scores", type=Path, help="folder of <run>.csv.gz score files")
    ap.add_argument("--confirm-windows", type=int, default=1)
    ap.add_argument("--drift-windows", type=int, default=100)
    args = ap.parse_args(argv)
    print(f"confirm_windows {args.confirm_windows}, drift_windows {args.drift_windows}, "
          f"from the recorded thresholds")
    print("| run | measured windows | windows flagged (both models) | first flagged window |")
    print("|---|---:|---:|---:|")
    clean = 0
    for path in sorted(args.scores.glob("*.csv.gz")):
        n, flagged, first = replay(path, args.confirm_windows, args.drift_windows)
        name = path.name.removesuffix(".csv.gz")
        clean += flagged if "clean" in name else 0
        print(f"| {name} | {n} | {flagged} | {first if first is not None else '-'} |")
    print(f"\nclean runs: {clean} windows flagged")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
