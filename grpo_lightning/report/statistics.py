"""Statistics of a sweep's final metrics: the Student-t interval of a mean over seeds, the paired
t-test, equivalence test (TOST), effect size and minimum detectable effect of a difference to the
baseline over shared seeds, Holm's correction, Wilson intervals of proportions and Welch's t-test."""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence

import numpy as np


def seed_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t confidence interval ``(mean, low, high)`` of a mean over seeds.

    ``mean +- t_{(1 + confidence) / 2, n - 1} * s / sqrt(n)`` with ``s`` the sample standard
    deviation (``ddof=1``): exact for normal seeds, and close for the sums over prompts a metric
    averages (``tests/report/test_statistics.py`` measures its coverage). Every interval over
    seeds in a report is this one. One value gives ``(value, nan, nan)`` (no interval: one seed
    says nothing about the spread of seeds); none gives three ``nan``.
    """
    x = _finite_array(values)
    n = len(x)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    mean = float(x.mean())
    if n == 1:
        return (mean, math.nan, math.nan)
    half = t_quantile((1.0 + confidence) / 2.0, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return (mean, mean - half, mean + half)


@functools.lru_cache(maxsize=1024)
def t_quantile(q: float, dof: int) -> float:
    """The ``q`` quantile of Student's t with ``dof`` degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(q, dof))


def paired_test(differences: Sequence[float]) -> tuple[float, float]:
    """The paired two-sided t-test of a mean difference of zero: ``(t, p)``.

    ``t = mean(d) / (s_d / sqrt(n))`` with ``n - 1`` degrees of freedom (``scipy.stats.ttest_rel``
    of the two arms' values); ``nan`` with fewer than two differences or when all are equal (no
    spread to test against).
    """
    from scipy import stats

    d = _finite_array(differences)
    if len(d) < 2 or no_spread(d):
        return (math.nan, math.nan)
    t = float(d.mean()) / (float(d.std(ddof=1)) / math.sqrt(len(d)))
    return (t, float(2.0 * stats.t.sf(abs(t), len(d) - 1)))


def equivalence_test(differences: Sequence[float], margin: float) -> float:
    """The paired equivalence test (TOST) of a mean difference within ``(-margin, +margin)``: its p.

    Two one-sided paired t-tests, of ``mean(d) <= -margin`` by ``t_low = (mean(d) + margin) / se``
    (``p_low = P(T > t_low)``) and of ``mean(d) >= +margin`` by ``t_high = (mean(d) - margin) / se``
    (``p_high = P(T < t_high)``), ``se = s_d / sqrt(n)``, ``n - 1`` degrees of freedom; ``p`` is the
    larger of the two. ``p < alpha`` exactly when the ``1 - 2 alpha`` t-interval of ``mean(d)`` lies
    inside ``(-margin, +margin)``. ``nan`` with fewer than two differences, without a spread, or
    without a positive margin.
    """
    from scipy import stats

    d = _finite_array(differences)
    if len(d) < 2 or no_spread(d) or not margin > 0 or not math.isfinite(margin):
        return math.nan
    se = float(d.std(ddof=1)) / math.sqrt(len(d))
    mean = float(d.mean())
    p_low = float(stats.t.sf((mean + margin) / se, len(d) - 1))
    p_high = float(stats.t.cdf((mean - margin) / se, len(d) - 1))
    return max(p_low, p_high)


def standardised_effect(differences: Sequence[float]) -> float:
    """Cohen's d_z of paired differences: ``mean(d) / s_d`` (``nan`` without a spread)."""
    d = _finite_array(differences)
    if len(d) < 2 or no_spread(d):
        return math.nan
    return float(d.mean()) / float(d.std(ddof=1))


def no_spread(values: Sequence[float]) -> bool:
    """Whether values are equal up to floating-point rounding (``0.35 - 0.30`` and ``0.30 - 0.25``
    differ in the 17th digit): a t statistic of such a spread would be an artefact."""
    x = _finite_array(values)
    return len(x) == 0 or float(np.ptp(x)) <= 1e-12 * max(float(np.abs(x).max()), 1e-300)


#: Power at which ``minimum_detectable_effect`` is given.
POWER = 0.8


def minimum_detectable_effect(sd: float, n: int, alpha: float = 0.05, power: float = POWER) -> float:
    """The smallest true mean difference a two-sided paired t-test at level ``alpha`` finds with
    probability ``power``, given ``n`` pairs whose differences spread by ``sd``.

    Solved on the noncentral t: the test statistic of a true difference ``delta`` follows
    ``t(n - 1, delta sqrt(n) / sd)``, and ``delta`` is raised until it passes
    ``+-t_{1 - alpha / 2, n - 1}`` with probability ``power``: ``detectable_shift(n - 1) sd / sqrt(n)``.
    By hand, ``(t_{1 - alpha / 2, n - 1} + t_{power, n - 1}) * sd / sqrt(n)`` comes close from below
    (5% low at 3 pairs and alpha 0.05, 1% at 5). ``nan`` below two pairs or without a spread.
    """
    if n < 2 or not math.isfinite(sd) or sd <= 0:
        return math.nan
    return detectable_shift(n - 1, alpha, power) * sd / math.sqrt(n)


@functools.lru_cache(maxsize=65536)
def detectable_shift(dof: float, alpha: float = 0.05, power: float = POWER) -> float:
    """The noncentrality ``lambda`` at which the two-sided t-test at level ``alpha`` on ``dof`` degrees
    of freedom rejects with probability ``power``: ``P(|T| > t_{1 - alpha / 2, dof}) = power`` for
    ``T ~ t(dof, lambda)`` (both tails counted), solved numerically. A test of standard error ``se``
    detects ``lambda se`` with that power (its minimum detectable effect). ``dof = inf``: the normal
    test, ``Phi(lambda - z) + Phi(-lambda - z) = power`` with ``z = z_{1 - alpha / 2}``; it falls with
    ``dof`` towards that limit. ``t_{1 - alpha / 2, dof} + t_{power, dof}`` comes close, from below at
    few ``dof`` (9% low at 3 and ``alpha`` 0.05 / 6). ``nan`` where ``dof`` is not positive."""
    from scipy import optimize, stats

    dof = float(dof)
    if not dof > 0:
        return math.nan
    if math.isinf(dof):
        critical = float(stats.norm.ppf(1.0 - alpha / 2.0))

        def shortfall(shift: float) -> float:
            return float(stats.norm.sf(critical - shift) + stats.norm.cdf(-critical - shift)) - power

        guess = critical + float(stats.norm.ppf(power))
    else:
        critical = t_quantile(1.0 - alpha / 2.0, dof)

        def shortfall(shift: float) -> float:
            below = float(stats.nct.cdf(-critical, dof, shift))
            return float(stats.nct.sf(critical, dof, shift)) + (below if math.isfinite(below) else 0.0) - power

        guess = critical + t_quantile(power, dof)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # the noncentral t's series at a fraction of a dof
        low, high = 0.5 * guess, 2.0 * guess
        while shortfall(high) < 0:  # few degrees of freedom: the noncentral t's upper tail is heavy
            low, high = high, 2.0 * high
            if high > 1e12:
                return math.nan
        return float(optimize.brentq(shortfall, low, high, xtol=1e-12 * max(1.0, guess)))


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
    # none or all: the bound is 0 or 1 exactly, not its rounding
    return (0.0 if successes <= 0 else max(0.0, centre - half), 1.0 if successes >= trials else min(1.0, centre + half))


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
