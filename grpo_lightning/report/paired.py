"""Statistics of an arm against the baseline from per-prompt outcomes, paired by seed and by prompt:
the two-level (seeds x prompts) t-interval of the mean difference on the variance components of a
crossed two-way layout, its tests and minimum detectable effect; the probability that the arm beats
the baseline at a seed; robust summaries over seeds (median, IQM); and the check for a seed far
from the others (a collapsed run), under which no interval over seeds is trustworthy.

Every seed validates on the same prompts, so seeds and prompts are crossed, not nested:
``D[s, p] = arm[s, p] - baseline[s, p] = delta + a_s + b_p + e_sp`` with a seed effect ``a``
(variance ``sigma2_seed``), a prompt effect ``b`` (on which prompts the arm helps:
``sigma2_prompt``) and their interaction ``e`` (``sigma2_residual``). The mean of ``D`` has variance
``sigma2_seed / S + sigma2_prompt / P + sigma2_residual / (S P)`` over new seeds and new prompts of
the task. ``benchmarks/interval_coverage.py`` measures the coverage of this interval against the
seed-level t-interval and the two-level percentile bootstrap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from grpo_lightning.report.statistics import POWER, detectable_shift, no_spread, t_quantile, wilson_interval


@dataclass(frozen=True)
class Components:
    """Mean squares of ``D [S, P]`` (two-way ANOVA without replication) and what they estimate.

    ``MS_seed = P sum_s (D_s. - D..)^2 / (S - 1)``, ``MS_prompt = S sum_p (D_.p - D..)^2 / (P - 1)``,
    ``MS_residual = sum_sp (D_sp - D_s. - D_.p + D..)^2 / ((S - 1)(P - 1))``;
    ``E[MS_prompt] = sigma2_residual + S sigma2_prompt``, ``E[MS_residual] = sigma2_residual``.
    """

    seeds: int
    prompts: int
    ms_seed: float
    ms_prompt: float
    ms_residual: float

    @property
    def seed_variance(self) -> float:
        """``MS_seed / P``: the variance of a seed's mean difference over the ``P`` prompts."""
        return self.ms_seed / self.prompts

    @property
    def prompt_variance(self) -> float:
        """``sigma2_prompt = max(0, (MS_prompt - MS_residual) / S)``."""
        return max(0.0, (self.ms_prompt - self.ms_residual) / self.seeds)

    @property
    def prompt_dof(self) -> float:
        """Satterthwaite's degrees of freedom of ``(MS_prompt - MS_residual) / S``:
        ``(MS_prompt - MS_residual)^2 / (MS_prompt^2 / (P - 1) + MS_residual^2 / ((S - 1)(P - 1)))``
        (``0`` where ``MS_prompt <= MS_residual``: no positive estimate to carry any)."""
        if not self.ms_prompt > self.ms_residual:
            return 0.0
        parts = self.ms_prompt**2 / (self.prompts - 1) + self.ms_residual**2 / ((self.seeds - 1) * (self.prompts - 1))
        return (self.ms_prompt - self.ms_residual) ** 2 / parts

    def prompt_variance_upper(self, confidence: float = 0.95) -> float:
        """The upper end of ``sigma2_prompt``'s interval, on its own degrees of freedom: Satterthwaite's
        ``dof_p sigma2_prompt / chi2_{(1 - confidence) / 2, dof_p}`` (``dof_p``: :attr:`prompt_dof`), but at most
        ``MS_prompt (P - 1) / (S chi2_{(1 - confidence) / 2, P - 1})``, the bound that holds whatever
        ``sigma2_residual`` is (``S sigma2_prompt <= E[MS_prompt]``, ``MS_prompt`` on ``P - 1`` dof): where
        ``sigma2_prompt`` is near zero, Satterthwaite's ``dof_p`` is a fraction of one and its bound meaningless."""
        from scipy import stats

        q = (1 - confidence) / 2
        bound = self.ms_prompt * (self.prompts - 1) / (self.seeds * float(stats.chi2.ppf(q, self.prompts - 1)))
        dof = self.prompt_dof
        if dof > 0:
            bound = min(bound, self.prompt_variance * dof / float(stats.chi2.ppf(q, dof)))
        return bound


def mean_squares(differences: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(MS_seed, MS_prompt, MS_residual)`` of ``differences [..., S, P]`` (``S, P >= 2``), each ``[...]``."""
    d = np.asarray(differences, dtype=float)
    seeds, prompts = d.shape[-2:]
    grand = d.mean(axis=(-2, -1), keepdims=True)
    rows, columns = d.mean(axis=-1, keepdims=True), d.mean(axis=-2, keepdims=True)
    ms_seed = prompts * ((rows - grand) ** 2).sum(axis=(-2, -1)) / (seeds - 1)
    ms_prompt = seeds * ((columns - grand) ** 2).sum(axis=(-2, -1)) / (prompts - 1)
    ms_residual = ((d - rows - columns + grand) ** 2).sum(axis=(-2, -1)) / ((seeds - 1) * (prompts - 1))
    return ms_seed, ms_prompt, ms_residual


def components(differences: np.ndarray) -> Components:
    """The mean squares of ``differences [S, P]``."""
    seeds, prompts = np.shape(differences)
    return Components(seeds, prompts, *(float(ms) for ms in mean_squares(differences)))


def standard_error(ms_seed, ms_prompt, ms_residual, seeds: int, prompts: int) -> tuple[np.ndarray, np.ndarray]:
    """``(se, dof)`` of the mean difference: ``se^2 = MS_seed / (S P) + sigma2_prompt / P``, the
    seed-level ``s_d^2 / S`` (``s_d``: the spread of the seeds' mean differences) plus the
    prompt-level variance. With ``sigma2_prompt > 0``, ``se^2 = (MS_seed + MS_prompt - MS_residual) / (S P)``
    and Satterthwaite's ``dof = se^4 / sum_i (MS_i / (S P))^2 / dof_i`` (``dof_i``: ``S - 1``,
    ``P - 1``, ``(S - 1)(P - 1)``); without, exactly the seed-level t (``dof = S - 1``)."""
    n = seeds * prompts
    ms_seed, ms_prompt, ms_residual = (np.asarray(ms, dtype=float) for ms in (ms_seed, ms_prompt, ms_residual))
    prompt_level = ms_prompt > ms_residual
    variance = np.where(prompt_level, (ms_seed + ms_prompt - ms_residual) / n, ms_seed / n)
    parts = ((ms_seed / n) ** 2 / (seeds - 1) + (ms_prompt / n) ** 2 / (prompts - 1)
             + (ms_residual / n) ** 2 / ((seeds - 1) * (prompts - 1)))  # fmt: skip
    with np.errstate(invalid="ignore", divide="ignore"):
        dof = np.where(prompt_level, variance**2 / np.where(parts > 0, parts, 1.0), seeds - 1.0)
    return np.sqrt(variance), dof


def two_level_interval(differences: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, ...]:
    """``(mean, low, high, se, dof)`` of ``differences [..., S, P]``: ``mean(D) -+ t_{(1 + confidence) / 2, dof} se``."""
    from scipy import stats

    d = np.asarray(differences, dtype=float)
    se, dof = standard_error(*mean_squares(d), *d.shape[-2:])
    mean = d.mean(axis=(-2, -1))
    with np.errstate(invalid="ignore"):
        half = np.where(se > 0, stats.t.ppf((1.0 + confidence) / 2.0, np.maximum(dof, 1e-9)) * se, 0.0)
    return mean, mean - half, mean + half, se, dof


@dataclass(frozen=True)
class TwoLevel:
    """``arm - baseline`` over ``S`` seeds and ``P`` prompts: the mean, its interval, ``se`` and
    ``dof``, the paired two-sided ``t`` and ``p``, and the variance components."""

    mean: float
    low: float
    high: float
    se: float
    dof: float
    t: float
    p: float
    components: Components


def two_level_test(arm: np.ndarray, baseline: np.ndarray, confidence: float = 0.95) -> TwoLevel:
    """The difference of two ``[S, P]`` score tables (row ``s``: seed ``s`` of either arm; column
    ``p``: prompt ``p``): :func:`two_level_interval`, ``t = mean(D) / se`` and its two-sided ``p``
    on ``dof`` (``nan`` without a spread: ``se = 0``, or every difference equal up to rounding)."""
    from scipy import stats

    d = np.asarray(arm, dtype=float) - np.asarray(baseline, dtype=float)
    mean, low, high, se, dof = (float(v) for v in two_level_interval(d, confidence))
    if no_spread(d.ravel()):  # equal up to rounding: a t statistic of that spread would be an artefact
        low, high, se = mean, mean, 0.0
    t = mean / se if se > 0 else math.nan
    p = float(2.0 * stats.t.sf(abs(t), dof)) if se > 0 else math.nan
    return TwoLevel(mean, low, high, se, dof, t, p, components(d))


def two_level_equivalence(result: TwoLevel, margin: float) -> float:
    """TOST on the two-level mean: the larger of ``P(T > (mean + margin) / se)`` and
    ``P(T < (mean - margin) / se)``, ``T ~ t(dof)``; ``nan`` without a spread or margin."""
    from scipy import stats

    if not result.se > 0 or not margin > 0 or not math.isfinite(margin):
        return math.nan
    low = float(stats.t.sf((result.mean + margin) / result.se, result.dof))
    high = float(stats.t.cdf((result.mean - margin) / result.se, result.dof))
    return max(low, high)


def design_mde(result: TwoLevel, alpha: float = 0.05, power: float = POWER, confidence: float = 0.95,
               seeds: int | None = None, prompts: int | None = None) -> tuple[float, float, float]:  # fmt: skip
    """The minimum detectable effect of a design of ``S'`` seeds and ``P'`` prompts (default the
    ``S`` and ``P`` run), ``(mde, low, high)``: the ``delta`` that the two-sided test at level ``alpha``
    rejects with probability ``power`` when ``mean(D) / sqrt(v)`` follows the noncentral
    ``t(dof', delta / sqrt(v))``, ``MDE = lambda(dof') sqrt(v)`` (``statistics.detectable_shift``, as the
    MDE over seeds is solved), ``v = sigma2_seed / S' + MS_residual / (S' P') + sigma2_prompt / P'`` with the unbiased
    ``sigma2_seed = (MS_seed - MS_residual) / P`` (negative where the seeds agree better than the
    prompts' noise predicts: ``v`` is then still the interval's ``se^2`` at the design run and positive
    with more seeds; ``nan`` where it is not positive) and ``dof`` the interval's Satterthwaite ``dof``
    scaled with the seeds as in :func:`seeds_for_mde`, ``dof' = dof (S' - 1) / (S - 1)``. At the design run
    ``v = se^2`` and ``dof' = dof``. Its interval (of the run's ``dof``): ``v`` between ``dof v / chi2_{(1 + confidence) / 2, dof}`` and
    ``dof v / chi2_{(1 - confidence) / 2, dof}`` (the chi-square of the Satterthwaite variance)."""
    from scipy import stats

    c = result.components
    seeds = seeds or c.seeds
    variance = design_variance(c, seeds, prompts or c.prompts)
    if not variance > 0:
        return (math.nan, math.nan, math.nan)
    factor = detectable_shift(float(design_dof(result, seeds)), alpha, power)
    upper, lower = (float(stats.chi2.ppf(q, result.dof)) for q in ((1 + confidence) / 2, (1 - confidence) / 2))
    return (factor * math.sqrt(variance), factor * math.sqrt(variance * result.dof / upper),
            factor * math.sqrt(variance * result.dof / lower))


def design_dof(result: TwoLevel, seeds):
    """The degrees of freedom of a design of ``seeds`` seeds (a count or an array of them): the run's
    Satterthwaite ``dof`` scaled with the seeds, ``dof' = dof (S' - 1) / (S - 1)`` (``dof`` itself at one seed)."""
    c = result.components
    return result.dof * ((seeds - 1) / (c.seeds - 1)) if c.seeds > 1 else result.dof


def design_variance(c: Components, seeds, prompts: int):
    """``v = sigma2_seed / S' + MS_residual / (S' P') + sigma2_prompt / P'`` of :func:`design_mde`, with
    ``sigma2_seed = (MS_seed - MS_residual) / P``; ``seeds``: a count or an array of them."""
    seed_level = (c.ms_seed - c.ms_residual) / c.prompts
    return seed_level / seeds + c.ms_residual / (seeds * prompts) + c.prompt_variance / prompts


#: The most seeds :func:`seeds_for_mde` tries: a design needing more reads "more than MAX_SEEDS".
MAX_SEEDS = 10_000


@dataclass(frozen=True)
class SeedsForMde:
    """The seeds a design of ``prompts`` prompts needs for an MDE of ``target``: ``seeds`` at the estimated
    variance and ``upper`` at the upper end of its interval, each the smallest count that reaches the target,
    or None where no count up to ``max_seeds`` does. ``floor`` and ``upper_floor``: the MDE that unlimited
    seeds leave, the prompts' term alone; where it is not below ``target``, more prompts are needed."""

    target: float
    prompts: int
    max_seeds: int
    seeds: int | None
    upper: int | None
    floor: float
    upper_floor: float

    @property
    def reachable(self) -> bool:
        """Whether enough seeds reach the target at the estimated variance (else more prompts are needed)."""
        return self.seeds is not None or self.floor < self.target

    @property
    def upper_reachable(self) -> bool:
        """Whether enough seeds reach the target at the variance's upper bound."""
        return self.upper is not None or self.upper_floor < self.target


def seeds_for_mde(result: TwoLevel, target: float, alpha: float = 0.05, power: float = POWER, prompts: int | None = None,
                  confidence: float = 0.95, max_seeds: int = MAX_SEEDS) -> SeedsForMde | None:  # fmt: skip
    """The fewest seeds ``S'`` (2 to ``max_seeds``) whose design of ``P'`` prompts (default the ``P`` run) has
    ``MDE(S') = lambda(dof') sqrt(v(S')) <= target``: the noncentral-t MDE of :func:`design_mde` (``lambda``:
    ``statistics.detectable_shift`` at ``alpha`` and ``power``), ``v(S') = sigma2_seed / S' + MS_residual / (S' P')
    + sigma2_prompt / P'``, and the interval's Satterthwaite ``dof`` scaled with the seeds, ``dof' = dof (S' - 1) /
    (S - 1)`` (at ``S' = S`` :func:`design_mde`'s MDE). ``upper``: the same with each term at the upper end of its
    interval: the seeds' terms ``v(S') - sigma2_prompt / P'`` at ``dof (.) / chi2_{(1 - confidence) / 2, dof}`` (the
    chi-square of the Satterthwaite variance, which the seeds' few dof set) and ``sigma2_prompt`` at
    :meth:`Components.prompt_variance_upper` (its own dof). Unlimited seeds leave ``lambda(inf) sqrt(sigma2_prompt /
    P')`` (``floor``; ``lambda(inf)``: the normal test's, about ``z_{1 - alpha / 2} + z_{power}``), and ``upper_floor``
    at the upper bound. None where the variance is not estimable: fewer than two seeds, no finite ``dof``, or ``v``
    positive at no count."""
    from scipy import stats

    c = result.components
    if c.seeds < 2 or not math.isfinite(result.dof) or not result.dof > 0 or not target > 0:
        return None
    prompts = prompts or c.prompts
    counts = np.arange(2, max_seeds + 1)
    variance = design_variance(c, counts, prompts)
    if not (variance > 0).any():
        return None
    dof = design_dof(result, counts)
    lower = float(stats.chi2.ppf((1 - confidence) / 2, result.dof))
    prompt_term, prompt_upper = c.prompt_variance / prompts, c.prompt_variance_upper(confidence) / prompts
    widened = (variance - prompt_term) * result.dof / lower + prompt_upper
    normal = detectable_shift(math.inf, alpha, power)
    return SeedsForMde(target, prompts, max_seeds, _fewest(counts, dof, variance, target, alpha, power),
                       _fewest(counts, dof, widened, target, alpha, power), normal * math.sqrt(prompt_term),
                       normal * math.sqrt(prompt_upper))  # fmt: skip


def _fewest(counts: np.ndarray, dof: np.ndarray, variance: np.ndarray, target: float, alpha: float,
            power: float) -> int | None:  # fmt: skip
    """The first of ``counts`` whose MDE ``lambda(dof) sqrt(variance)`` (with a positive variance) is at most
    ``target``. ``lambda`` falls as ``dof`` grows with the count; where the variance does not grow with it either
    (every design of the run's prompts), the MDE falls with the count, and a bisection finds the first."""

    def mde(i: int) -> float:
        return detectable_shift(float(dof[i]), alpha, power) * math.sqrt(variance[i]) if variance[i] > 0 else math.inf

    if (variance > 0).all() and (np.diff(variance) <= 0).all() and (np.diff(dof) >= 0).all():
        if mde(len(counts) - 1) > target:
            return None
        low, high = 0, len(counts) - 1  # mde(high) <= target; find the first such index
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if mde(middle) <= target else (middle + 1, high)
        return int(counts[high])
    return next((int(counts[i]) for i in range(len(counts)) if mde(i) <= target), None)


def improvement_probability(differences: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """P(arm > baseline) at a seed, ``(p, low, high)``: the share of paired seeds at which the arm
    ended higher, a tie counting half (the paired form of the probability of improvement of Agarwal
    et al., 2021), with the Wilson interval of that share over the seeds."""
    d = np.asarray([float(v) for v in differences if math.isfinite(v)])
    if not len(d):
        return (math.nan, math.nan, math.nan)
    wins = float((d > 0).sum() + 0.5 * (d == 0).sum())
    return (wins / len(d), *wilson_interval(wins, len(d), confidence))


def interquartile_mean(values: Sequence[float]) -> float:
    """IQM: the mean of the values left after dropping ``floor(n / 4)`` from each end
    (``scipy.stats.trim_mean(values, 0.25)``; Agarwal et al., 2021)."""
    x = np.sort([float(v) for v in values if math.isfinite(v)])
    cut = len(x) // 4
    return float(x[cut : len(x) - cut].mean()) if len(x) else math.nan


#: Level of the check for a seed far from the others, over an arm's seeds (Bonferroni): one arm in
#: twenty with normal seeds is flagged by chance, so a flag says "look", not "drop it".
OUTLIER_ALPHA = 0.05
#: Fewest seeds the check runs on: with three, no seed is far from "the others" by any test.
OUTLIER_MIN_SEEDS = 4


#: Fewest seeds the check of an arm's seeds as a whole runs on: below it Shapiro and Wilk's test seldom
#: finds two clusters or a heavy tail.
SPREAD_MIN_SEEDS = 8
#: Level of that check, per arm: as with ``OUTLIER_ALPHA``, a flag says "look".
SPREAD_ALPHA = 0.05


def normal_spread_p(values: Sequence[float]) -> float:
    """Shapiro and Wilk's p for ``values`` being a normal sample: small where several seeds lie far from
    the rest (collapsed runs that hide each other from ``outlying_seeds``) or the seeds form two clusters.
    ``nan`` below ``SPREAD_MIN_SEEDS`` values, with a non-finite one, or without spread."""
    from scipy import stats

    x = np.asarray([float(v) for v in values], dtype=float)
    if len(x) < SPREAD_MIN_SEEDS or not np.isfinite(x).all() or no_spread(x):
        return math.nan
    return float(stats.shapiro(x).pvalue)


def outlying_seeds(values: Sequence[float], alpha: float = OUTLIER_ALPHA, floor: float = 0.0) -> list[int]:
    """Indices of the values far from the others: each value's externally studentized residual
    ``r_i = (x_i - mean_{-i}) / (s_{-i} sqrt(1 + 1 / (n - 1)))``, ``t(n - 2)``-distributed for normal
    seeds, beyond ``t_{1 - alpha / 2n, n - 2}`` (Bonferroni over the ``n`` seeds), and at least
    ``floor`` from ``mean_{-i}``. None below ``OUTLIER_MIN_SEEDS`` values."""
    x = np.asarray([float(v) for v in values], dtype=float)
    n = len(x)
    if n < OUTLIER_MIN_SEEDS or not np.isfinite(x).all():
        return []
    critical = t_quantile(1 - alpha / (2 * n), n - 2)
    found = []
    for i in range(n):
        others = np.delete(x, i)
        gap = abs(x[i] - others.mean())
        scale = others.std(ddof=1) * math.sqrt(1 + 1 / (n - 1))
        if gap > floor and (gap > critical * scale if scale > 1e-12 * max(abs(x).max(), 1e-300) else gap > 1e-12):
            found.append(i)
    return found if len(found) < n else []
