"""Detector fit time and peak memory against rows and features, before and after the fit cap.

Each point fits one entity's model as ``otel-eacgm detector fit`` does on a CSV (context
features derived, component search, out-of-fold threshold, final fit) in a fresh process on
one BLAS thread, and reports its wall time, its CPU time (user + system: the figure that
holds when other work shares the cores) and the process' peak RSS. "before" fits every
mixture on every window (``max_fit_windows`` unbounded: the EM cost of the fit before the
cap); "after" is the default configuration. Where both ran, the error of the sample is
reported on 2,000 later windows of the same series: the Spearman rank correlation of the
two models' scores, the change of their median score (in interquartile ranges of the
scores) and the share of those windows each model flags at its own threshold.

The windows are synthetic server metrics (``synthetic_windows``): a Markov chain of regimes
with their own means and correlations, heavy-tailed noise, a third of the columns Poisson
counts, slow drift; mixtures of several components, as real entities need.

    .venv/bin/python benchmarks/detector_fit_scaling.py [--rows 1000 3000 10000 30000]
        [--metrics 19 38] [--before-max-rows 30000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # one core: the target is per core

import numpy as np  # noqa: E402

TEST_WINDOWS = 2000


def synthetic_windows(n: int, d: int, seed: int = 0) -> np.ndarray:
    """``n`` windows of ``d`` metrics in time order (see the module docstring)."""
    rng = np.random.default_rng(seed)
    regimes = 6
    switch = rng.random(n) < 1 / 300  # a regime lasts about 300 windows
    state = np.maximum.accumulate(np.where(switch, np.arange(n), 0))
    state = rng.integers(0, regimes, n)[state]
    means = rng.normal(size=(regimes, d)) * 3
    mixing = rng.normal(size=(regimes, d, d)) / np.sqrt(d)
    noise = rng.standard_t(4, size=(n, d))
    X = np.empty((n, d))
    for k in range(regimes):
        m = state == k
        X[m] = means[k] + noise[m] @ mixing[k]
    X += rng.normal(size=(n, d)).cumsum(axis=0) * 0.005
    counts = d // 3
    X[:, :counts] = rng.poisson(np.exp(np.clip(X[:, :counts] / 3, -3, 3)) * 5)
    return X + 20


def child(rows: int, metrics: int, before: bool, out: str) -> None:
    """One fit in this process (``before``: every mixture on every window): time, peak RSS,
    and the scores of the later windows."""
    import resource

    from eacgm_detector.config import DetectorConfig
    from eacgm_detector.online import fit_table, table_features

    X = synthetic_windows(rows + TEST_WINDOWS, metrics)
    train, test = X[:rows], X[rows:]
    names = [f"m{j}" for j in range(metrics)]
    cfg = DetectorConfig(random_state=0)
    if before:
        cfg.max_fit_windows = rows
    cfg.validate()
    t = time.perf_counter()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = usage.ru_utime + usage.ru_stime
    model = fit_table(cfg, names, train)
    fit_s = time.perf_counter() - t
    det = model.detector
    Xt, _ = table_features(model, names, test)
    np.save(out + ".npy", det.score_samples(Xt))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    Path(out).write_text(json.dumps({
        "fit_s": fit_s, "cpu_s": usage.ru_utime + usage.ru_stime - cpu0, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "features": len(model.feature_names), "k": int(det.n_components_),
        "threshold": float(det.threshold_)}))


def run(rows: int, metrics: int, before: bool, tmp: str) -> dict:
    out = os.path.join(tmp, f"{rows}_{metrics}_{before}.json")
    cmd = [sys.executable, __file__, "--child", str(rows), str(metrics), str(int(before)), out]
    subprocess.run(cmd, check=True)
    got = json.loads(Path(out).read_text())
    got["scores"] = np.load(out + ".npy")
    return got


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--child":
        child(int(argv[1]), int(argv[2]), argv[3] == "1", argv[4])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1000, 3000, 10000, 30000])
    ap.add_argument("--metrics", type=int, nargs="+", default=[19, 38],
                    help="base metrics; the model sees 3x as many features (two context spans)")
    ap.add_argument("--before-max-rows", type=int, default=30000,
                    help="largest row count to also fit the uncapped way (it grows fast)")
    args = ap.parse_args(argv)
    print("| rows | features | before s (CPU s) | before peak RSS MiB | after s (CPU s) | after peak RSS MiB | "
          "speed-up (CPU) | k before / after | rank corr. of later scores | median score shift | "
          "later windows flagged before / after |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for metrics in args.metrics:
            for rows in args.rows:
                after = run(rows, metrics, False, tmp)
                cells = [str(rows), str(after["features"])]
                if rows <= args.before_max_rows:
                    before = run(rows, metrics, True, tmp)
                    spread = float(np.subtract(*np.percentile(before["scores"], [75, 25])))
                    cells += [f"{before['fit_s']:.1f} ({before['cpu_s']:.1f})", f"{before['rss_mib']:.0f}",
                              f"{after['fit_s']:.1f} ({after['cpu_s']:.1f})", f"{after['rss_mib']:.0f}",
                              f"{before['cpu_s'] / after['cpu_s']:.1f}x",
                              f"{before['k']} / {after['k']}",
                              f"{spearman(before['scores'], after['scores']):.3f}",
                              f"{(np.median(after['scores']) - np.median(before['scores'])) / spread:+.2f} IQR",
                              f"{np.mean(before['scores'] < before['threshold']):.2%} / "
                              f"{np.mean(after['scores'] < after['threshold']):.2%}"]
                else:
                    cells += ["-", "-", f"{after['fit_s']:.1f} ({after['cpu_s']:.1f})", f"{after['rss_mib']:.0f}", "-",
                              f"- / {after['k']}", "-", "-",
                              f"- / {np.mean(after['scores'] < after['threshold']):.2%}"]
                print("| " + " | ".join(cells) + " |", flush=True)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
