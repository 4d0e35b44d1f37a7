"""Score statistics of ``jaxrl plot`` (``jaxrl.analysis.curves``), in numpy: IQM and bootstrap CIs.

The interquartile mean (IQM) with a percentile-bootstrap confidence interval over runs is what
Agarwal et al., "Deep Reinforcement Learning at the Edge of the Statistical Precipice" (NeurIPS
2021, the ``rliable`` library) recommend. With one task per group, rliable's stratified
bootstrap reduces to resampling the group's runs with replacement, which is what we do here, in
numpy (rliable itself pulls in heavy dependencies).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def iqm(x: Any) -> float:
    """Interquartile mean: the mean of the values left after dropping the lowest and highest 25%.

    Same as ``scipy.stats.trim_mean(x, 0.25)`` (rliable's ``aggregate_iqm``): ``k = int(0.25 * n)``
    values are cut from each end of the sorted sample, so nothing is cut for ``n < 4`` and, e.g.,
    one value from each end for ``n = 5..7``.

    Args:
        x: the sample (flattened).

    Returns:
        The interquartile mean.

    Raises:
        ValueError: if ``x`` is empty.
    """
    a = np.sort(np.asarray(x, dtype=np.float64).ravel())
    if a.size == 0:
        raise ValueError("iqm() of an empty sample; pass at least one value.")
    k = int(0.25 * a.size)
    return float(np.mean(a[k : a.size - k]))


def bootstrap_ci(
    values: Any,
    statistic: Callable[[np.ndarray], Any],
    *,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[Any, Any, Any]:
    """Percentile-bootstrap confidence interval of ``statistic`` over runs.

    The runs (rows of ``values``) are resampled with replacement ``n_boot`` times; the interval is
    the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of the statistic over the
    resamples. With one run every resample is that run, so ``low == high == point``: one run says
    nothing about the spread between runs. The result depends only on the inputs and ``seed``.

    Args:
        values: one entry per run, shape ``[runs]`` or ``[runs, ...]`` (e.g. ``[runs, steps]``).
        statistic: maps an array shaped like ``values`` to a scalar or an array (e.g. ``iqm`` or
            ``lambda v: v.mean(axis=0)`` for a curve).
        n_boot: number of bootstrap resamples.
        confidence: coverage of the interval, in (0, 1).
        seed: seed of the resampling.

    Returns:
        ``(point, low, high)``: the statistic on ``values`` and the interval's bounds (floats for a
        scalar statistic, arrays otherwise).

    Raises:
        ValueError: on no runs, ``n_boot < 1`` or ``confidence`` outside (0, 1).
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 0 or v.shape[0] == 0:
        raise ValueError("bootstrap_ci() needs at least one run (values has no rows).")
    if n_boot < 1:
        raise ValueError(f"n_boot must be at least 1, got {n_boot}.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95; got {confidence}.")
    point = _as_result(statistic(v))
    n = v.shape[0]
    if n == 1:
        return point, point, point
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    boots = np.stack([np.asarray(statistic(v[i]), dtype=np.float64) for i in idx])
    alpha = 1.0 - confidence
    low, high = np.quantile(boots, [alpha / 2, 1.0 - alpha / 2], axis=0)
    return point, _as_result(low), _as_result(high)


def _as_result(x: Any) -> Any:
    a = np.asarray(x, dtype=np.float64)
    return float(a) if a.ndim == 0 else a


__all__ = ["bootstrap_ci", "iqm"]
