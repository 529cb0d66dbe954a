"""Temporal context: each window's features next to how they moved from the recent past.

A window is judged against the windows that came before it as well as against the training
distribution: for every feature ``x`` and every span ``k`` in ``context_windows`` the window
also gets ``x.dev<k>``, its value minus the trimmed mean of the same feature over the
entity's previous ``k`` windows. A level that is normal in itself but arrived as a sudden
jump, or a slow creep that the raw value hides, shows up there; a long-lasting shift of
regime stops looking new once the recent windows share it.

The mean leaves out the highest and the lowest tenth of the previous values (at least one
each once there are three): with a plain mean, one wild window would shift the recent mean
of the next ``k`` windows, and a model that has learnt how steady that mean normally is
would flag all of them as an echo of the one anomaly.

The transform is causal (only earlier windows are used) and is the same in every path:
:func:`add_context` on a time-ordered table (``fit``/``score`` of a CSV, the benchmark) and
:class:`ContextTracker` one window at a time (the online service, recorded OTLP). Missing
values follow :func:`eacgm_detector.features.fill_value`: a missing count is 0, any other
missing value is skipped in the mean. A deviation is missing (NaN) without a current value,
without any earlier value, and until the entity has had ``k`` earlier windows: a mean over
fewer windows is noisier than the one the model learnt, and the short and long deviations
would be equal, which they never are in training. The model fills a missing deviation with
its most likely value given the window's other features (``GMMDetector``), so a series that
starts steady at any normal level is normal from its first window.
"""

from __future__ import annotations

import re

import numpy as np

from eacgm_detector.features import fill_value

#: Default spans, in windows: a short one (10 windows, 100 s at the default 10 s windows)
#: for jumps and a long one (30 windows) for slower drifts and long-lasting faults.
DEFAULT_CONTEXT_WINDOWS = (10, 30)

#: Values (rows x features x span) the trimmed mean sorts at once in :func:`add_context`:
#: 32 MiB of float64, whatever the table's length.
_BLOCK_VALUES = 1 << 22

_SUFFIX = re.compile(r"\.dev(\d+)$")


def context_name(name: str, k: int) -> str:
    """Name of the deviation of ``name`` from its mean over the previous ``k`` windows."""
    return f"{name}.dev{k}"


def base_name(name: str, windows) -> str:
    """The feature a context feature was derived from (``name`` itself for a base feature)."""
    m = _SUFFIX.search(name)
    return name[: m.start()] if m and int(m.group(1)) in windows else name


def derived_from(names: list[str], windows) -> list[int]:
    """Per name, the index of the feature it is a deviation of, or -1 (a plain feature, or
    one whose base is not among ``names``): ``GMMDetector``'s ``derived_from``."""
    index = {n: i for i, n in enumerate(names)}
    out = []
    for n in names:
        base = base_name(n, windows)
        out.append(index.get(base, -1) if base != n else -1)
    return out


def check_windows(windows) -> tuple[int, ...]:
    """``windows`` as a sorted tuple of distinct spans >= 1; ``ValueError`` naming a bad one."""
    out = []
    for k in windows:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"context_windows: {k!r} is not a window count >= 1")
        out.append(int(k))
    return tuple(sorted(set(out)))


def trimmed_mean(W: np.ndarray) -> np.ndarray:
    """Mean over the last axis without its highest and lowest tenth (at least one each when
    three or more values are known), NaN ignored; NaN where nothing is known.

    Parameters
    ----------
    W : ndarray of shape (..., k)

    Returns
    -------
    ndarray of shape (...)
    """
    W = np.sort(W, axis=-1)  # NaN sorts last
    count = (~np.isnan(W)).sum(axis=-1)
    cut = np.where(count >= 3, np.maximum(1, count // 10), 0)[..., None]
    idx = np.arange(W.shape[-1])
    keep = (idx >= cut) & (idx < count[..., None] - cut)
    kept = keep.sum(axis=-1)
    total = np.where(keep, W, 0.0).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(kept > 0, total / np.maximum(kept, 1), np.nan)


def add_context(X: np.ndarray, names: list[str], windows) -> tuple[np.ndarray, list[str]]:
    """Append the deviation features to a time-ordered table.

    Parameters
    ----------
    X : ndarray of shape (n_windows, n_features)
        One entity's windows in time order; NaN is a missing value.
    names : list of str
        Column names of ``X``.
    windows : iterable of int
        Spans ``k``; empty returns ``X`` unchanged.

    Returns
    -------
    X_context : ndarray of shape (n_windows, n_features * (1 + len(windows)))
        ``X`` followed by one block of deviations per span, in ``windows`` order.
    names_context : list of str
        ``names`` followed by ``context_name(name, k)`` per block.
    """
    windows = check_windows(windows)
    X = np.asarray(X, dtype=float)
    n, d = X.shape
    blocks, out_names = [X], list(names)
    for k in windows:
        padded = np.vstack([np.full((k, d), np.nan), X])
        # previous[t] holds rows t-k .. t-1, shape (n, d, k): a view; the trimmed mean sorts a
        # copy, so it goes a block of rows at a time to keep memory linear in n, not n * k.
        previous = np.lib.stride_tricks.sliding_window_view(padded, k, axis=0)[:n]
        step = max(1, _BLOCK_VALUES // max(d * k, 1))
        dev = np.empty((n, d))
        for a in range(0, n, step):
            dev[a:a + step] = X[a:a + step] - trimmed_mean(previous[a:a + step])
        dev[:k] = np.nan  # fewer than k earlier windows
        blocks.append(dev)
        out_names += [context_name(name, k) for name in names]
    return np.hstack(blocks).reshape(n, d * (1 + len(windows))), out_names


class ContextTracker:
    """One entity's recent windows, to add context features to each new one.

    ``augment`` takes a window's feature dict (in arrival order, every window: warm-up and
    flagged ones too, since context is what preceded) and returns it with the deviation
    features added; values equal :func:`add_context` on the same sequence vectorized over
    every name the tracker has seen (a count that stopped appearing is 0, not unknown),
    except that a name's deviations are unknown before its first window: a tracker cannot
    know future names. The recent windows are kept as a matrix over those names, bounded by
    the vocabulary.
    """

    def __init__(self, windows=DEFAULT_CONTEXT_WINDOWS) -> None:
        self.windows = check_windows(windows)
        self._depth = max(self.windows, default=0)
        self._columns: dict[str, int] = {}
        self._fills: list[float] = []
        self._names: list[str] = []
        # _recent[i] is window seen - depth + i (oldest first); rows before the first are NaN.
        self._recent = np.full((self._depth, 0), np.nan)
        self._seen = 0
        # One string per (feature, span), shared by every window's dict: the history keeps
        # up to history_windows of them per entity.
        self._context_names: dict[tuple[str, int], str] = {}

    def augment(self, feats: dict[str, float]) -> dict[str, float]:
        """``feats`` plus ``<name>.dev<k>`` for each span; remembers ``feats``."""
        if not self.windows:
            return feats
        new = [n for n in feats if n not in self._columns]
        if new:
            self._add_columns(new)
        now = np.array([feats.get(n, f) for n, f in zip(self._names, self._fills)], dtype=float)
        out = dict(feats)
        for k in self.windows:
            if k > self._seen:
                continue
            dev = now - trimmed_mean(self._recent[-k:].T)
            out.update({self._name(n, k): float(v)
                        for n, v in zip(self._names, dev) if not np.isnan(v)})
        self._recent = np.vstack([self._recent[1:], now[None]])
        self._seen += 1
        return out

    def _add_columns(self, names: list[str]) -> None:
        fills = [fill_value(n) for n in names]
        past = np.tile(np.asarray(fills, dtype=float), (self._depth, 1))
        # Rows of windows that were never seen stay unknown, whatever the feature.
        past[: max(self._depth - self._seen, 0)] = np.nan
        self._recent = np.hstack([self._recent, past])
        for n, f in zip(names, fills):
            self._columns[n] = len(self._names)
            self._names.append(n)
            self._fills.append(f)

    def _name(self, name: str, k: int) -> str:
        key = (name, k)
        got = self._context_names.get(key)
        if got is None:
            got = self._context_names[key] = context_name(name, k)
        return got
