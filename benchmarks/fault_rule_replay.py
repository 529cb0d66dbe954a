"""A confirmation rule replayed on the per-window scores of recorded GPU fault runs.

``fault_analysis.py`` writes every scored window of the fault benchmark (score, threshold,
single-window threshold, run below) to ``scores/*.csv.gz`` beside its report, so that a
decision rule can be tried after the recordings themselves are gone. This replays one rule
on those files: each window below its model's threshold alone (``confirm_windows`` 1, the
default since 2026-12-07), or the recorded rule (``--confirm-windows 2``: two in a row or
one beyond the single-window threshold), and prints per run the windows flagged and, for a
fault run, the first flagged measured window.

What it cannot replay is a new threshold: that needs the models' held-out scores, which the
files do not hold. The recorded threshold is an upper bound on a Peaks-Over-Threshold
threshold at a smaller risk for the same held-out scores (it moves away from the median as
the risk falls), so the windows flagged here at the recorded threshold include every window
a smaller risk would flag.

    .venv/bin/python benchmarks/fault_rule_replay.py docs/gpu-runs/2026-12-06/scores [--confirm-windows 1]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import sys
from pathlib import Path


def replay(path: Path, confirm: int) -> tuple[int, int, int | None]:
    """(measured windows, windows flagged, 1-based index of the first flagged measured window)
    of one run's scores file, each model's windows in order."""
    rows = list(csv.DictReader(gzip.open(path, "rt")))
    runs: dict[str, int] = {}
    starts = sorted({int(r["timestamp"]) for r in rows if r.get("measured", "1") == "1"})
    flagged, first = 0, None
    for r in rows:
        score, thr, single = float(r["score"]), float(r["threshold"]), float(r["single_threshold"])
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
    args = ap.parse_args(argv)
    print(f"confirm_windows {args.confirm_windows}, at the recorded thresholds")
    print("| run | measured windows | windows flagged (both models) | first flagged window |")
    print("|---|---:|---:|---:|")
    clean = 0
    for path in sorted(args.scores.glob("*.csv.gz")):
        n, flagged, first = replay(path, args.confirm_windows)
        name = path.name.removesuffix(".csv.gz")
        clean += flagged if "clean" in name else 0
        print(f"| {name} | {n} | {flagged} | {first if first is not None else '-'} |")
    print(f"\nclean runs: {clean} windows flagged")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
