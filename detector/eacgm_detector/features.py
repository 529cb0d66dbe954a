"""Window features: stable, bounded names built from whatever telemetry arrives.

Names (``docs/detector.md`` lists them):

- ``span.<layer>.<function>.count``, ``.error_rate``, ``.log_duration.mean``,
  ``.log_duration.p95`` and, for spans with ``nccl.bytes``, ``.log_bandwidth``;
- ``metric.<name>.mean`` and ``.max`` for gauges, ``metric.<name>.rate`` for counters
  (per second), with the value of a split attribute such as ``network.io.direction``
  appended to ``<name>`` when present; for histograms ``metric.<name>.count.rate``,
  ``metric.<name>.sum.rate`` and ``metric.<name>.mean``, the mean of what the window added.

Functions beyond ``max_functions`` per layer and metrics beyond ``max_metrics`` share an
``other`` bucket, so a process calling thousands of distinct functions cannot grow the
feature space. A missing count is a true zero (no calls); any other missing feature is NaN
and the model imputes it, since "no gauge reported" is not "gauge read 0".

Metrics named by ``exclude_metrics`` (prefixes; default :data:`DEFAULT_EXCLUDED_METRICS`) are
no features at all. A model learns "normal" from the processes it was fitted on, so a value
that is fixed for a process but differs between processes (which GPU it got, what the agent
attached to it) would make every new process look anomalous while saying nothing about how
the job runs; and the agent's self-telemetry describes the observer, not the job.
"""

from __future__ import annotations

import math

import numpy as np

from eacgm_detector.records import MetricPoint
from eacgm_detector.windows import Window

OTHER = "other"
DEFAULT_SPLIT_ATTRIBUTES = ("network.io.direction", "direction")
#: ``eacgm.agent.*``: the agent's own counters and gauges (probes attached, its overhead
#: estimate of each traced process, probe duty cycles), set by the agent's decisions rather
#: than by the job. ``hw.gpu.memory.limit``, ``eacgm.gpu.power.limit``: a device's capacity
#: and configuration, an identity of the hardware a process landed on.
DEFAULT_EXCLUDED_METRICS = ("eacgm.agent.", "hw.gpu.memory.limit", "eacgm.gpu.power.limit")


class Vocabulary:
    """First-come, capped naming of functions and metric series for one entity."""

    def __init__(self, *, max_functions: int = 32, max_layers: int = 8, max_metrics: int = 64,
                 split_attributes: tuple[str, ...] = DEFAULT_SPLIT_ATTRIBUTES,
                 exclude_metrics: tuple[str, ...] = DEFAULT_EXCLUDED_METRICS) -> None:
        self.max_functions = max_functions
        self.max_layers = max_layers
        self.max_metrics = max_metrics
        self.split_attributes = split_attributes
        self.exclude_metrics = tuple(exclude_metrics)
        self._functions: dict[str, set[str]] = {}
        self._metrics: set[str] = set()

    def function_key(self, layer: str, function: str) -> tuple[str, str]:
        """(layer, function), or their ``other`` bucket once a cap is reached."""
        if layer not in self._functions:
            if len(self._functions) >= self.max_layers:
                layer = OTHER
            self._functions.setdefault(layer, set())
        seen = self._functions[layer]
        if function not in seen:
            if len(seen) >= self.max_functions:
                return layer, OTHER
            seen.add(function)
        return layer, function

    def metric_key(self, p: MetricPoint) -> str | None:
        """Series name: metric name plus split attribute value, or the ``other`` bucket; None
        for an excluded metric (which takes no place in the vocabulary either)."""
        if p.name.startswith(self.exclude_metrics):
            return None
        attrs = dict(p.series)
        split = next((attrs[a] for a in self.split_attributes if a in attrs), None)
        name = p.name if split is None else f"{p.name}.{split}"
        if name not in self._metrics:
            if len(self._metrics) >= self.max_metrics:
                return OTHER
            self._metrics.add(name)
        return name


def window_features(win: Window) -> dict[str, float]:
    """Feature values of one closed window (only the features it has data for)."""
    seconds = (win.end_ns - win.start_ns) / 1e9
    out: dict[str, float] = {}
    for (layer, fn), st in win.functions.items():
        base = f"span.{layer}.{fn}"
        out[f"{base}.count"] = float(st.count)
        out[f"{base}.error_rate"] = st.errors / st.count
        ld = np.asarray(st.log_durations)
        out[f"{base}.log_duration.mean"] = float(ld.mean())
        out[f"{base}.log_duration.p95"] = float(np.quantile(ld, 0.95))
        if st.nccl_seconds > 0:
            out[f"{base}.log_bandwidth"] = math.log1p(st.nccl_bytes / st.nccl_seconds)
    for name, ms in win.metrics.items():
        if not ms.has_data():
            continue
        if ms.kind == "gauge":
            out[f"metric.{name}.mean"] = ms.mean()
            out[f"metric.{name}.max"] = ms.max()
        else:
            out[f"metric.{name}.rate"] = ms.rate(seconds)
    for name, ms in win.metrics.items():  # a histogram's mean over this window
        count = win.metrics.get(name.removesuffix(".sum") + ".count") if name.endswith(".sum") else None
        if count is not None and count.has_data() and ms.has_data() and count.increase > 0:
            out[f"metric.{name.removesuffix('.sum')}.mean"] = ms.increase / count.increase
    return out


def fill_value(name: str) -> float:
    """What a feature is when the window has no data for it: 0 for counts, else NaN."""
    return 0.0 if name.endswith(".count") else math.nan


def vectorize(rows: list[dict[str, float]], names: list[str]) -> np.ndarray:
    """Feature dicts to a (n_windows, n_features) array in ``names`` order."""
    fills = [fill_value(n) for n in names]
    return np.array([[r.get(n, f) for n, f in zip(names, fills)] for r in rows], dtype=float).reshape(len(rows), len(names))


def feature_names(rows: list[dict[str, float]]) -> list[str]:
    """Sorted union of the names in ``rows``: the model's feature list."""
    return sorted({n for r in rows for n in r})


def is_logarithmic(name: str) -> bool:
    """Whether a feature (or a context feature of one) is a logarithm, whose differences are
    ratios: ``GMMDetector``'s ``logarithmic``."""
    return ".log_" in name


def feature_category(name: str) -> str:
    """What a person reads from a feature: communication, gpu, network, latency, errors or calls."""
    if ".nccl." in name or name.startswith("span.nccl") or name.endswith(".log_bandwidth"):
        return "communication"
    if name.startswith("metric.hw.") or "gpu" in name:
        return "gpu"
    if "network" in name or name.startswith("metric.system.net"):
        return "network"
    if ".log_duration." in name or "duration" in name:
        return "latency"
    if name.endswith(".error_rate"):
        return "errors"
    if name.startswith("span."):
        return "calls"
    return "other"
