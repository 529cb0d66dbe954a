"""Detector benchmark: labeled server-metric data sets, the detector against baselines.

One model per entity, thresholds without test labels, figures averaged over entities:
point-wise precision/recall/F1, event recall, AUC-PR and VUS-PR (``tsb-ad``, installed by
scripts/setup.sh), for the detector, random scores, PCA reconstruction error and
IsolationForest. Throughput and memory are in detector_throughput.py.

The detector's method and defaults (the alarm budget per entity-hour and the threshold
following drift among them) were chosen looking at the first half of each data set's entities
only (in the order below: omi-1..6, service0..14; benchmarks/detector_rule_sweep.py); the
tables average over all entities, that half, and the other half, which nothing was chosen on.

    .venv/bin/python benchmarks/detector_accuracy.py [--datasets asd jumpstarter2] [--no-vus]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# One BLAS/OpenMP thread per worker: --jobs workers each running the libraries' own thread
# pools would oversubscribe the cores, and OpenBLAS threads spin while they wait.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from detector_baselines import SCORERS  # noqa: E402
from detector_metrics import figures, generate_curve  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets"
COLUMNS = ["P", "R", "F1", "event R", "AUC-PR", "VUS-PR"]
#: Seconds between rows: ASD's 5-minute samples (its README); JumpStarter's 1 minute (4 days
#: of training rows, 5,760). The detector's alarm budget is per hour, so it needs them.
WINDOW_S = {"asd": 300.0, "jumpstarter2": 60.0}


def entities(path: Path) -> list[str]:
    with np.load(path) as d:
        return sorted({k.split("/")[0] for k in d.files}, key=lambda e: (len(e), e))


def run_entity(job) -> dict:
    path, ent, vus = job
    with np.load(path) as d:
        train, test, labels = d[f"{ent}/train"], d[f"{ent}/test"], d[f"{ent}/test_label"]
    out = {}
    for name, scorer in SCORERS.items():
        t = time.perf_counter()
        extra = {"window_s": WINDOW_S[path.stem]} if name.startswith("detector") else {}
        scores, flags = scorer(train, test, **extra)
        fit_s = time.perf_counter() - t
        out[name] = figures(labels, scores, flags, vus) | {"_s": fit_s, "_n": len(test)}
    return out


def table(title: str, rows: dict[str, dict[str, float]]) -> str:
    cols = [c for c in COLUMNS if any(c in r for r in rows.values())]
    lines = [f"\n{title}", "| method | " + " | ".join(cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for name, r in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + " |")
    return "\n".join(lines)


def _means(per_entity: list[dict]) -> dict[str, dict[str, float]]:
    return {name: {c: float(np.nanmean([r[name][c] for r in per_entity]))
                   for c in per_entity[0][name] if not c.startswith("_")}
            for name in SCORERS}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["asd", "jumpstarter2"])
    ap.add_argument("--no-vus", action="store_true", help="skip VUS-PR (the slowest figure)")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    vus = not args.no_vus
    if vus and generate_curve is None:
        print("VUS-PR: tsb-ad is not importable (pip install --no-deps tsb-ad); column left out")
    started = time.perf_counter()
    for ds in args.datasets:
        path = DATA / f"{ds}.npz"
        ents = entities(path)
        with ProcessPoolExecutor(args.jobs) as pool:
            per_entity = list(pool.map(run_entity, [(path, e, vus) for e in ents]))
        print(table(f"{ds}: {len(ents)} entities, one model each, mean over entities",
                    _means(per_entity)))
        half = len(ents) // 2
        print(table(f"{ds}: the {half} entities {ents[0]}..{ents[half - 1]} only (the rules were "
                    f"chosen on these)", _means(per_entity[:half])))
        held = per_entity[half:]
        print(table(f"{ds}: the {len(held)} entities {ents[half]}..{ents[-1]} only "
                    f"(not used to choose anything)", _means(held)))
        gmm = [r["detector (GMM)"] for r in per_entity]
        print(f"detector fit+score: {np.mean([g['_s'] for g in gmm]):.2f} s per entity (mean)")
    print(f"\npeak RSS of the largest worker (one entity's fits and scores at a time): "
          f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MiB")
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
