"""Statistics of a sweep's final metrics: intervals of a mean over seeds (percentile bootstrap,
Student t), Wilson intervals of proportions, Welch's t-test and Holm's correction."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t confidence interval ``(mean, low, high)`` of independent samples.

    ``mean +- t_{(1 + confidence) / 2, n - 1} * s / sqrt(n)`` with ``s`` the sample standard
    deviation (``ddof=1``). One value gives ``(value, nan, nan)``; none gives three ``nan``.
    """
    from scipy import stats

    x = np.asarray([float(v) for v in values], dtype=float)
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    mean = float(x.mean())
    if n == 1:
        return (mean, math.nan, math.nan)
    half = float(stats.t.ppf((1.0 + confidence) / 2.0, n - 1)) * float(x.std(ddof=1)) / math.sqrt(n)
    return (mean, mean - half, mean + half)


#: Resamples of ``bootstrap_ci``; its generator is seeded so that reports are reproducible.
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def bootstrap_ci(
    values: Sequence[float],
    confidence: float = 0.95,
    bounds: tuple[float, float] = (-math.inf, math.inf),
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float, float]:
    """Mean and percentile-bootstrap interval ``(mean, low, high)`` of independent samples.

    ``resamples`` means of ``n`` values drawn with replacement; the interval is their
    ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles. A mean of resampled values
    lies within ``[min, max]`` of the data, so the interval does too; it is also clipped to
    ``bounds``, the range the quantity can take. One value gives ``(value, nan, nan)``.
    """
    x = _finite_array(values)
    if len(x) == 0:
        return (math.nan, math.nan, math.nan)
    mean = float(x.mean())
    if len(x) == 1:
        return (mean, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    low = min(max(float(low), float(x.min()), bounds[0]), mean)
    high = max(min(float(high), float(x.max()), bounds[1]), mean)
    return (mean, low, high)


def wilson_interval(successes: float, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval ``(low, high)`` of a proportion ``successes / trials``.

    ``(p + z^2 / 2n -+ z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n)`` with
    ``z`` the normal ``(1 + confidence) / 2`` quantile; always inside ``[0, 1]``.
    """
    from scipy import stats

    if trials <= 0:
        return (math.nan, math.nan)
    z = float(stats.norm.ppf((1 + confidence) / 2))
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def welch_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Welch's two-sided t-test of equal means without assuming equal variances: ``(t, p)``.

    ``t = (mean_a - mean_b) / sqrt(s_a^2 / n_a + s_b^2 / n_b)``; ``nan`` when either sample
    has fewer than two values or both have zero variance.
    """
    from scipy import stats

    x, y = _finite_array(a), _finite_array(b)
    if len(x) < 2 or len(y) < 2:
        return (math.nan, math.nan)
    if x.var(ddof=1) == 0 and y.var(ddof=1) == 0:
        return (math.nan, math.nan)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # nearly identical samples: precision notes
        result = stats.ttest_ind(x, y, equal_var=False)
    return (float(result.statistic), float(result.pvalue))


def welch_dof(a: Sequence[float], b: Sequence[float]) -> float:
    """Welch-Satterthwaite degrees of freedom of ``welch_test(a, b)``."""
    x, y = _finite_array(a), _finite_array(b)
    if len(x) < 2 or len(y) < 2:
        return math.nan
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    if va + vb == 0:
        return math.nan
    return float((va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1)))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (``nan`` entries stay ``nan`` and are not counted)."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if math.isfinite(p))
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    m = len(indexed)
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def _finite_array(values: Sequence[float]) -> np.ndarray:
    x = np.asarray([float(v) for v in values], dtype=float)
    return x[np.isfinite(x)]
