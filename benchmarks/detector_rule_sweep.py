"""Decision rules compared on the choosing halves of the labelled data sets only.

The detector's operating point (threshold, smoothing, confirmation) is chosen here, on the
first half of each development set's entities (ASD omi-1..6, JumpStarter service0..14), and
nowhere else: this script never loads the other half, so nothing chosen here has seen it.
``detector_accuracy.py`` then reports both halves and the whole sets once.

Step 1 fits one model per entity and fit variant (``VARIANTS``: covariance type, component
cap, ``reg_covar``, ``spike_floor``; ``refresh@<budget>``: the model refreshed on the test windows it does
not flag, as ``serve`` refits) and keeps each window's out-of-fold score (training, time
order) and each test window's score in a cache folder; step 2 replays decision rules on
those scores without refitting:

* ``raw``: a window below the threshold at the budget's risk (the rule of 2026-12-07);
* ``mean<w>`` / ``median<w>``: the causal mean / median of the last w log-likelihoods
  against a threshold set the same way on the equally smoothed out-of-fold scores;
* ``k<k>of<n>``: at least k of the last n windows below the raw threshold;
* ``shift<w>``: the threshold following drift over the last w windows not flagged
  (``eacgm_detector.drift.DriftThreshold``, the product's code).

Every rule is tried at several alarm budgets (per entity-hour). Printed: per data set the
mean point-wise P/R/F1, event recall and AUC-PR of the decision statistic over the choosing
half's entities, and PCA's and IsolationForest's for comparison. What was run for #30
(docs/detector.md, "Operating point"):

    B=benchmarks/detector_rule_sweep.py; C="--cache /tmp/sweep30 --jobs 2"
    nice -n 10 .venv/bin/python -W ignore $B $C --variants full diag \
        --rules raw mean2 mean3 mean5 median3 k2of3 k2of2 --budgets 0.1 0.25 0.5 1 2
    nice -n 10 .venv/bin/python -W ignore $B $C --variants refresh@0.5 --rules raw --budgets 0.5
    nice -n 10 .venv/bin/python -W ignore $B $C --variants reg0.1 reg0.3 reg1 --rules raw mean3 \
        --budgets 0.1 0.25 0.5 1
    nice -n 10 .venv/bin/python -W ignore $B $C --rules shift100 shift300 shift1000 --budgets 0.1 0.25 0.5 1
    nice -n 10 .venv/bin/python -W ignore $B $C --rules raw shift30 shift50 shift100 shift200 \
        --budgets 0.35 0.5 0.75

and for the variance floor on spiky features (third round; its cache began as a copy of the
``full`` and ``reg1`` files above, whose fits did not change):

    C="--cache /tmp/sweep30b --jobs 2"
    nice -n 10 .venv/bin/python -W ignore $B $C --variants reg1 spike0.3 spike1 --rules raw shift100 \
        --budgets 0.25 0.5 1
    nice -n 10 .venv/bin/python -W ignore $B $C --variants spike1 spike3 --rules raw shift100 \
        --budgets 0.25 0.5 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from detector_accuracy import DATA, WINDOW_S, entities  # noqa: E402
from detector_baselines import isolation_forest, pca_error  # noqa: E402
from detector_metrics import figures  # noqa: E402

from eacgm_detector.config import DetectorConfig  # noqa: E402
from eacgm_detector.drift import DriftThreshold  # noqa: E402
from eacgm_detector.online import fit_table, model_from_config, table_features  # noqa: E402
from eacgm_detector.threshold import pot_threshold  # noqa: E402

#: Fit variants; all but the spike floors pin ``spike_floor`` 0, the model of the rounds before
#: it (``full``: the defaults of then).
VARIANTS = {name: {"spike_floor": 0.0, **over} for name, over in {
    "full": {}, "diag": {"covariance_type": "diag"}, "full-k1": {"max_components": 1},
    "full-k2": {"max_components": 2}, "reg0.03": {"reg_covar": 0.03}, "reg0.1": {"reg_covar": 0.1},
    "reg0.3": {"reg_covar": 0.3}, "reg1": {"reg_covar": 1.0}}.items()}
VARIANTS.update({f"spike{f:g}": {"spike_floor": f} for f in (0.1, 0.3, 1.0, 3.0)})
TRIM = 0.005


def choosing_half(ds: str) -> list[str]:
    ents = entities(DATA / f"{ds}.npz")
    return ents[: len(ents) // 2]


def fit_one(job) -> str:
    ds, ent, variant, cache = job
    out = cache / f"{ds}__{ent}__{variant}.npz"
    if out.exists():
        return str(out)
    with np.load(DATA / f"{ds}.npz") as d:
        train, test, labels = d[f"{ent}/train"], d[f"{ent}/test"], d[f"{ent}/test_label"]
    t = time.perf_counter()
    refresh = variant.startswith("refresh@")
    over = {"alarms_per_hour": float(variant.split("@")[1])} if refresh else VARIANTS[variant]
    cfg = DetectorConfig(random_state=0, window_s=WINDOW_S[ds], drift_windows=0, **over).validate()
    names = [f"x{j}" for j in range(train.shape[1])]
    model = fit_table(cfg, names, train)
    X, _ = table_features(model, names, test)
    extra = {}
    if refresh:
        H, _ = table_features(model, names, train)
        scores, thresholds = refreshed_scores(cfg, model, H, X)
        extra["thresholds"] = thresholds
    else:
        scores = model.detector.score_samples(X)
    if variant == "full":
        (pca, pca_f), (forest, forest_f) = pca_error(train, test), isolation_forest(train, test)
        extra = {"pca": pca, "pca_flags": pca_f, "iforest": forest, "iforest_flags": forest_f}
    np.savez(out, oof=model.detector.holdout_scores_, test=scores, labels=labels,
             fit_s=time.perf_counter() - t, k=model.detector.n_components_, **extra)
    return str(out)


def threshold(oof: np.ndarray, risk: float) -> float:
    """The detector's threshold rule on held-out scores: trim the lowest 0.5 %, POT at risk."""
    s = np.sort(oof)[int(np.ceil(TRIM * oof.size)):]
    return pot_threshold(s, risk)[0]


def decide(rule: str, oof: np.ndarray, test: np.ndarray, risk: float, thr=None) -> tuple[np.ndarray, np.ndarray]:
    """(decision statistic, higher = more normal; flags) of one rule on one entity."""
    if rule == "refreshed":
        return test - thr, test < thr
    if rule == "raw":
        return test, test < threshold(oof, risk)
    if rule.startswith(("mean", "median")):
        how = "mean" if rule.startswith("mean") else "median"
        w = int(rule.removeprefix(how))
        s_oof, s_test = smooth_scores(oof, w, how), smooth_scores(test, w, how)
        return s_test, s_test < threshold(s_oof, risk)
    if rule.startswith("shift"):
        return shifted(oof, test, risk, int(rule.removeprefix("shift")))
    if rule.startswith("k"):
        k, n = (int(v) for v in rule[1:].split("of"))
        below = (test < threshold(oof, risk)).astype(int)
        counts = np.convolve(below, np.ones(n, int))[: below.size]
        return test, below.astype(bool) & (counts >= k)
    raise ValueError(rule)


def shifted(oof: np.ndarray, test: np.ndarray, risk: float, span: int) -> tuple[np.ndarray, np.ndarray]:
    """The threshold following drift over ``span`` windows (the product's DriftThreshold)."""
    t, med = threshold(oof, risk), float(np.median(oof))
    drift = DriftThreshold(t, -np.inf, med, span)
    stat = np.empty(test.size)
    for i, s in enumerate(test):
        stat[i] = s - drift.current()[0]
        drift.observe(float(s), stat[i] < 0)
    return stat, stat < 0


def smooth_scores(scores: np.ndarray, window: int, how: str = "mean") -> np.ndarray:
    """The causal mean or median of the last ``window`` scores at each position (fewer at
    the start)."""
    s = np.asarray(scores, dtype=float)
    if window == 1 or s.size == 0:
        return s.copy()
    if how == "mean":
        c = np.concatenate([[0.0], np.cumsum(s)])
        idx = np.arange(1, s.size + 1)
        lo = np.maximum(idx - window, 0)
        return (c[idx] - c[lo]) / (idx - lo)
    pad = np.concatenate([np.full(window - 1, np.nan), s])
    return np.nanmedian(np.lib.stride_tricks.sliding_window_view(pad, window), axis=1)


def refreshed_scores(cfg: DetectorConfig, model, history: np.ndarray,
                     X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Score ``X`` as ``serve`` scores an entity that started from ``model``: windows at or
    above the threshold join a history (initially the last ``history_windows`` training
    rows), and after every ``refit_every`` of them the model is refreshed on it at its size.
    Each window's score and the threshold it was compared with."""
    hist = deque(history[-cfg.history_windows:], maxlen=cfg.history_windows)
    det, size = model.detector, model.detector.n_components_
    scores, thresholds = np.empty(len(X)), np.empty(len(X))
    since = 0
    for i, x in enumerate(X):
        s = float(det.score_samples(x[None, :])[0])
        scores[i], thresholds[i] = s, det.threshold_
        if s >= det.threshold_:
            hist.append(x)
            since += 1
            if since >= cfg.refit_every:
                det = model_from_config(cfg, model.feature_names).fit(np.asarray(hist), n_components=size)
                since = 0
    return scores, thresholds


def evaluate(cache: Path, datasets, variants, rules, budgets) -> None:
    for ds in datasets:
        ents = choosing_half(ds)
        data = {v: [np.load(cache / f"{ds}__{e}__{v}.npz") for e in ents] for v in variants}
        base = data["full"]
        print(f"\n{ds}: choosing half {ents[0]}..{ents[-1]} ({len(ents)} entities), means")
        print("| variant | rule | budget/h | P | R | F1 | event R | AUC-PR |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for name, key in (("PCA", "pca"), ("IsolationForest", "iforest")):
            rows = [figures(d["labels"], d[key], d[f"{key}_flags"], False) for d in base]
            _print(name, "-", "-", rows)
        for v in variants:
            if v.startswith("refresh@"):
                rows = []
                for d in data[v]:
                    stat, flags = decide("refreshed", None, d["test"], 0, d["thresholds"])
                    rows.append(figures(d["labels"], -stat, flags, False))
                _print(v, "refreshed", v.split("@")[1], rows)
                continue
            for rule in rules:
                for b in budgets:
                    rows = []
                    for d in data[v]:
                        risk = min(b * WINDOW_S[ds] / 3600.0, 0.5)
                        stat, flags = decide(rule, d["oof"], d["test"], risk)
                        rows.append(figures(d["labels"], -stat, flags, False))
                    _print(v, rule, b, rows)


def _print(variant, rule, budget, rows) -> None:
    m = {c: float(np.nanmean([r[c] for r in rows])) for c in ("P", "R", "F1", "event R", "AUC-PR")}
    print(f"| {variant} | {rule} | {budget} | " + " | ".join(f"{m[c]:.3f}" for c in m) + " |")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, required=True, help="folder for the per-entity scores")
    ap.add_argument("--datasets", nargs="+", default=["asd", "jumpstarter2"])
    ap.add_argument("--variants", nargs="+", default=["full"], help=f"{', '.join(VARIANTS)} or refresh@<budget>")
    ap.add_argument("--rules", nargs="+", default=["raw", "mean2", "mean3", "median3", "k2of3"])
    ap.add_argument("--budgets", nargs="+", type=float, default=[0.25, 0.5, 1.0])
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    variants = list(dict.fromkeys(["full", *args.variants]))
    jobs = [(ds, e, v, args.cache) for ds in args.datasets for v in variants for e in choosing_half(ds)]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        list(pool.map(fit_one, jobs))
    print(f"fits: {time.perf_counter() - started:.0f} s")
    evaluate(args.cache, args.datasets, variants, args.rules, args.budgets)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
