"""Each arm against the sweep's baseline arm: the paired difference over the seeds both ran, its
t-interval, effect size, Holm-corrected p, equivalence test and minimum detectable effect, the
probability that the arm ends higher at a seed, and the verdict they give: different, equivalent
within a margin, or undetermined. Where every paired run wrote its per-prompt outcomes (val/accuracy),
the difference is paired by prompt too and its interval, tests and MDE are the two-level ones of
:mod:`~grpo_lightning.report.paired` (seeds x prompts); elsewhere they are over the seeds' final values.

Seeds are shared across arms (the same seed draws the same prompts and start), so the difference
at each seed removes what the seed alone decides; a paired test on those differences has more
power than comparing two means. Whether two intervals overlap is never used as a test.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from grpo_lightning.report.arms import Arm, SeedCount, seed_order
from grpo_lightning.report.render.document import Doc, user_text
from grpo_lightning.report.render.formatting import fmt, fmt_interval, fmt_metric, fmt_p
from grpo_lightning.report.metrics import PROPORTION, REWARD_SCALE_KEYS, SUMMARY_METRICS, WALL_CLOCK_METRICS, metric_bounds
from grpo_lightning.report.outcomes import score_tables
from grpo_lightning.report.paired import (
    SeedsForMde,
    TwoLevel,
    design_mde,
    improvement_probability,
    outlying_seeds,
    seeds_for_mde,
    two_level_equivalence,
    two_level_test,
)
from grpo_lightning.report.statistics import (
    equivalence_test,
    holm,
    minimum_detectable_effect,
    paired_test,
    seed_interval,
    standardised_effect,
)

#: Level of the tests, after Holm's correction over the arms compared with the baseline.
ALPHA = 0.05
#: Differences smaller than this are not called better or worse, however significant: an absolute
#: difference of accuracies and shares (one point), and a share of the baseline's mean elsewhere.
PRACTICAL_ABSOLUTE = 0.01
PRACTICAL_RELATIVE = 0.02
#: Paired seeds below which no comparison gets a verdict: the numbers are printed, but a t-test
#: over two pairs rests on one degree of freedom, and its MDE is 11.5 standard deviations of the differences.
MIN_PAIRED_SEEDS = 3
#: Differences within this margin are shown equivalent by the equivalence test (``--equivalence-margin``):
#: two points of accuracies and shares, and 2% of the baseline's mean elsewhere (see ``equivalence_margin``).
EQUIVALENCE_MARGIN = 0.02
#: The MDE the Effects section gives the seeds for (``--target-mde``): in the units of accuracies and shares, and
#: a share of the baseline's mean elsewhere, as ``EQUIVALENCE_MARGIN`` is (see ``equivalence_margin``).
TARGET_MDE = 0.04


@dataclass
class Effect:
    """``arm`` minus ``baseline`` on ``key`` over ``n`` shared seeds: the mean difference with its
    interval, Cohen's d_z, the paired t-test (``p``, and ``p_holm`` over the arms compared), the
    minimum detectable effect at 80% power, the practical threshold, the equivalence test within
    ``margin`` (``p_equivalence_holm``: its p after Holm's correction over the arms compared) and
    the verdict."""

    arm: str
    baseline: str
    key: str
    n: int
    mean: float
    low: float
    high: float
    effect_size: float
    t: float
    p: float
    p_holm: float
    mde: float
    threshold: float
    verdict: str
    differences: list[float]
    #: The seeds either arm ran: ``used`` the pairs, ``excluded`` why each other seed is no pair.
    pairs: SeedCount | None = None
    #: The equivalence margin in ``key``'s units (see ``equivalence_margin``).
    margin: float = math.nan
    p_equivalence_holm: float = math.nan
    #: The two-level analysis over seeds and prompts, where per-prompt outcomes gave one.
    two_level: TwoLevel | None = None
    #: The MDE's interval (chi-square on the variance behind it).
    mde_interval: tuple[float, float] = (math.nan, math.nan)
    #: The two-level design's MDE with twice the seeds, and with twice the prompts (what either would buy).
    mde_doubled: tuple[float, float] = (math.nan, math.nan)
    #: The seeds the two-level design needs for the target MDE, with these prompts (``paired.seeds_for_mde``).
    seeds_needed: SeedsForMde | None = None
    #: P(arm > baseline) at a seed, with its Wilson interval (``paired.improvement_probability``).
    improvement: tuple[float, float, float] = (math.nan, math.nan, math.nan)


def practical_threshold(key: str, baseline_mean: float) -> float:
    """The smallest difference on ``key`` the report calls a difference (see ``PRACTICAL_*``)."""
    if metric_bounds(key.rpartition(":")[2]) == PROPORTION:
        return PRACTICAL_ABSOLUTE
    return PRACTICAL_RELATIVE * abs(baseline_mean) if math.isfinite(baseline_mean) else math.nan


def far_seeds(arm: Arm, key: str) -> dict[Any, float]:
    """The seeds of ``arm`` whose final ``key`` lies far from its other seeds' (``paired.outlying_seeds``,
    and by at least the practical threshold), with their values."""
    by_seed = arm.finals_by_seed(key)
    values = list(by_seed.values())
    floor = practical_threshold(key, sum(values) / len(values)) if values else 0.0
    far = outlying_seeds(values, floor=floor)
    return {seed: by_seed[seed] for i, seed in enumerate(by_seed) if i in far}


def equivalence_margin(key: str, baseline_mean: float, margin: float = EQUIVALENCE_MARGIN) -> float:
    """``margin`` in ``key``'s units: as it is on accuracies and shares (a proportion's scale is 1),
    and as a share of the baseline's mean elsewhere. Tokens, KL, seconds and rewards (whose scale the
    reward functions and weights set) have no scale of their own, so the baseline gives it; as with
    ``practical_threshold``, one rule for every metric."""
    if metric_bounds(key.rpartition(":")[2]) == PROPORTION:
        return margin
    return margin * abs(baseline_mean) if math.isfinite(baseline_mean) else math.nan


def paired_differences(arm: Arm, baseline: Arm, key: str) -> list[float]:
    """``arm``'s final ``key`` minus ``baseline``'s at each seed both have, in seed order."""
    mine, theirs = arm.finals_by_seed(key), baseline.finals_by_seed(key)
    shared = sorted(set(mine) & set(theirs), key=seed_order)
    return [mine[s] - theirs[s] for s in shared]


def paired_seeds(arm: Arm, baseline: Arm, key: str, label: str) -> SeedCount:
    """The pairs behind ``arm`` minus ``baseline`` on ``key``, out of the seeds either arm ran, and
    why each other seed is no pair (which arm lacks it, and why)."""
    ran = {a.name: {c.seed for c in a.cells + a.unfinished} for a in (arm, baseline)}
    missing = {a.name: a.excluded_seeds(key, label) for a in (arm, baseline)}
    seeds = sorted(ran[arm.name] | ran[baseline.name], key=seed_order)
    excluded = []
    for seed in seeds:
        reasons = [f"{name} {missing[name][seed]}" if seed in ran[name] else f"not run by {name}"
                   for name in (arm.name, baseline.name) if seed not in ran[name] or seed in missing[name]]  # fmt: skip
        if reasons:
            excluded.append((seed, "; ".join(reasons)))
    return SeedCount(len(seeds) - len(excluded), len(seeds), tuple(excluded))


def pairs_text(effect: Effect) -> str:
    """``5``, ``5 x 200 prompts`` (two-level), or ``4 of 5 (seed 3: dapo diverged (final reward
    non-finite))``: the pairs an effect uses."""
    prompts = f" x {effect.two_level.components.prompts} prompts" if effect.two_level else ""
    if effect.pairs is None or not effect.pairs.excluded:
        return f"{effect.n}{prompts}"
    reasons = "; ".join(f"seed {seed}: {user_text(why)}" for seed, why in effect.pairs.excluded)
    return f"{effect.n}{prompts} of {effect.pairs.total} ({reasons})"


def mde_text(effect: Effect) -> str:
    """``0.061 [0.036, 0.18]``: the MDE with its interval."""
    return fmt_interval(effect.mde, *effect.mde_interval) if math.isfinite(effect.mde) else "n/a"


def seeds_needed_text(effects: Sequence[Effect], confidence: float) -> str:
    """``Seeds for an MDE of 0.04 with these 500 prompts (Holm over the 6 arms compared): **dr_grpo** 21 (41 at
    the variance's upper 95% bound); ...``: the seeds each two-level effect needs for the target MDE."""
    planned = [e for e in effects if e.seeds_needed is not None]
    if not planned:
        return ""
    prompts = {e.seeds_needed.prompts for e in planned}
    family = sum(1 for e in effects if math.isfinite(e.p))
    shared = f"these {prompts.pop()} prompts" if len(prompts) == 1 else "each arm's prompts"
    level = f"Holm over the {family} arms compared" if family > 1 else "one arm compared"
    each = "; ".join(f"**{user_text(e.arm)}** {_seeds_needed_phrase(e.seeds_needed, confidence)}" for e in planned)
    return f"Seeds for an MDE of {fmt(planned[0].seeds_needed.target, 2)} with {shared} ({level}): {each}."


def _seeds_needed_phrase(plan: SeedsForMde, confidence: float) -> str:
    """``21 (41 at the variance's upper 95% bound)``, or why no count of seeds reaches the target."""
    if not plan.reachable:
        return (f"not reachable with {plan.prompts} prompts (the prompts' variance alone gives an MDE of "
                f"{fmt(plan.floor, 2)}: more prompts are needed)")  # fmt: skip
    bound = f"at the variance's upper {confidence:.0%} bound"
    if not plan.upper_reachable:
        return (f"{_seeds_count(plan.seeds, plan)} (not reachable {bound}, where the prompts' variance alone gives "
                f"an MDE of {fmt(plan.upper_floor, 2)})")  # fmt: skip
    return f"{_seeds_count(plan.seeds, plan)} ({_seeds_count(plan.upper, plan)} {bound})"


def _seeds_count(count: int | None, plan: SeedsForMde) -> str:
    return f"{count:,}" if count is not None else f"more than {plan.max_seeds:,}"


def improvement_text(effect: Effect) -> str:
    """``0.8 [0.38, 0.96]``: P(arm > baseline) at a seed with its Wilson interval."""
    return fmt_interval(*effect.improvement)


def baseline_effects(arms: Sequence[Arm], baseline: Arm, key: str, direction: int, confidence: float = 0.95,
                     label: str | None = None, margin: float = EQUIVALENCE_MARGIN,
                     target_mde: float = TARGET_MDE) -> list[Effect]:  # fmt: skip
    """One ``Effect`` per arm other than ``baseline`` that logged ``key``; Holm's correction runs
    over these arms, for the paired test and for the equivalence test within ``margin`` (see
    ``equivalence_margin``); a two-level effect gets the seeds that bring its MDE to ``target_mde``
    (in ``key``'s units by the same rule). ``label``: the metric's name in the reasons a seed is no pair
    (default ``key``)."""
    others = [a for a in arms if a.name != baseline.name and a.finals(key)]
    base_mean = seed_interval(baseline.finals(key), confidence)[0]
    threshold = practical_threshold(key, base_mean)
    bound = equivalence_margin(key, base_mean, margin)
    target = equivalence_margin(key, base_mean, target_mde)
    effects = []
    for arm in others:
        d = paired_differences(arm, baseline, key)
        tables = score_tables(arm, baseline, key)
        two_level = two_level_test(*tables, confidence) if tables is not None else None
        mean, low, high = (two_level.mean, two_level.low, two_level.high) if two_level else seed_interval(d, confidence)
        t, p = (two_level.t, two_level.p) if two_level else paired_test(d)
        effects.append(Effect(arm.name, baseline.name, key, len(d), mean, low, high, standardised_effect(d), t, p,
                              math.nan, math.nan, threshold, "", d, paired_seeds(arm, baseline, key, label or key), bound,
                              two_level=two_level, improvement=improvement_probability(d, confidence)))  # fmt: skip
    family = max(1, sum(1 for e in effects if math.isfinite(e.p)))
    equivalence = holm([two_level_equivalence(e.two_level, bound) if e.two_level else equivalence_test(e.differences, bound)
                        for e in effects])  # fmt: skip
    for effect, adjusted, adjusted_equivalence in zip(effects, holm([e.p for e in effects]), equivalence):
        effect.p_holm = adjusted
        effect.p_equivalence_holm = adjusted_equivalence
        # at the level Holm's first step uses: a difference this large is found whatever its rank
        if math.isfinite(effect.p):
            mde, low, high = _mde(effect, ALPHA / family, confidence)
            effect.mde, effect.mde_interval = mde, (low, high)
            if effect.two_level is not None:
                prompts = effect.two_level.components.prompts
                effect.mde_doubled = (design_mde(effect.two_level, ALPHA / family, seeds=2 * effect.n)[0],
                                      design_mde(effect.two_level, ALPHA / family, prompts=2 * prompts)[0])  # fmt: skip
                effect.seeds_needed = seeds_for_mde(effect.two_level, target, ALPHA / family, confidence=confidence)
        effect.verdict = verdict(effect, direction)
    return effects


def _mde(effect: Effect, alpha: float, confidence: float) -> tuple[float, float, float]:
    """``(mde, low, high)``: the design's (``paired.design_mde``) with the two-level analysis; over
    seeds, ``minimum_detectable_effect`` of ``s_d``, which scales with ``s_d``, so its interval is
    the chi-square interval of ``s_d``: ``mde sqrt((n - 1) / chi2_{(1 +- confidence) / 2, n - 1})``."""
    from scipy import stats

    if effect.two_level is not None:
        return design_mde(effect.two_level, alpha, confidence=confidence)
    mde = minimum_detectable_effect(float(np.std(effect.differences, ddof=1)), effect.n, alpha)
    dof = effect.n - 1
    return (mde, *(mde * math.sqrt(dof / float(stats.chi2.ppf(q, dof))) for q in ((1 + confidence) / 2, (1 - confidence) / 2)))


def verdict(effect: Effect, direction: int) -> str:
    """Over at least ``MIN_PAIRED_SEEDS`` pairs: "better" or "worse" (``direction`` +1: higher is
    better, -1: lower is; 0: "higher" or "lower") when the Holm-corrected paired test rejects and the
    difference reaches the practical threshold ("below the practical threshold" when it does not);
    else "equivalent (±margin)" when the Holm-corrected equivalence test rejects a difference of the
    margin or more; else "undetermined (MDE ...)": no difference found is not no difference."""
    if effect.n < MIN_PAIRED_SEEDS:
        return f"too few seeds (n={effect.n}; {MIN_PAIRED_SEEDS} needed)"
    if all(d == 0 for d in effect.differences):
        return "identical at every seed"
    if not math.isfinite(effect.p):
        return f"no test: the difference is {fmt_metric(effect.differences[0], effect.key)} at every seed"
    if effect.p_holm < ALPHA:
        return _difference_verdict(effect, direction)
    if effect.p_equivalence_holm < ALPHA:
        return f"equivalent (±{fmt(effect.margin, 2)})"
    return f"undetermined (MDE {fmt(effect.mde, 2)})"


def _difference_verdict(effect: Effect, direction: int) -> str:
    if math.isfinite(effect.threshold) and abs(effect.mean) < effect.threshold:
        return f"below the practical threshold ({fmt(effect.threshold, 2)})"
    up = effect.mean > 0
    if direction == 0:
        return "higher" if up else "lower"
    return "better" if up == (direction > 0) else "worse"


def difference_text(effect: Effect) -> str:
    """``+0.05 [0.01, 0.09]``: the mean paired difference with its interval."""
    if not math.isfinite(effect.mean):
        return "n/a"
    sign = "+" if effect.mean > 0 else ""
    if not math.isfinite(effect.low):
        return f"{sign}{fmt(effect.mean)}"
    return f"{sign}{fmt(effect.mean)} [{fmt(effect.low)}, {fmt(effect.high)}]"


def identical_arms(arms: Sequence[Arm], tags: Sequence[str] = ("reward", "kl", "val/accuracy")) -> list[tuple[str, str]]:
    """Pairs of arms that ran the same seeds and logged the same value of each of ``tags`` at every
    step of every seed: whatever sets them apart did nothing."""
    pairs = []
    for i, a in enumerate(arms):
        for b in arms[i + 1 :]:
            if _same_runs(a, b, tags):
                pairs.append((a.name, b.name))
    return pairs


def _same_runs(a: Arm, b: Arm, tags: Sequence[str]) -> bool:
    seeds_a = {c.seed: r for c, r in zip(a.cells, a.runs)}
    seeds_b = {c.seed: r for c, r in zip(b.cells, b.runs)}
    if set(seeds_a) != set(seeds_b) or not seeds_a:
        return False
    compared = 0
    for seed, run in seeds_a.items():
        other = seeds_b[seed]
        for tag in tags:
            x, y = run.scalars.get(tag), other.scalars.get(tag)
            if x is None and y is None:
                continue
            if x is None or y is None or not np.array_equal(x.values, y.values) or not np.array_equal(x.steps, y.steps):
                return False
            compared += 1
    return compared > 0


def different_starts(arms: Sequence[Arm], baseline: Arm, key: str = "initial:val/accuracy") -> list[tuple[str, float, float]]:
    """Arms whose value before training differs from the baseline's at some shared seed:
    ``(arm, its mean, the baseline's mean)`` over the shared seeds."""
    found = []
    for arm in arms:
        if arm.name == baseline.name:
            continue
        mine, theirs = arm.finals_by_seed(key), baseline.finals_by_seed(key)
        shared = sorted(set(mine) & set(theirs), key=str)
        if any(mine[s] != theirs[s] for s in shared):
            found.append((arm.name, float(np.mean([mine[s] for s in shared])), float(np.mean([theirs[s] for s in shared]))))
    return found


def comparable_arms(arms: Sequence[Arm], baseline: Arm, key: str, configs: Mapping[str, Mapping[str, str]]) -> list[Arm]:
    """The arms whose ``key`` is on the baseline's scale: for the training reward, those with the
    baseline's reward functions (a reward of other functions measures something else)."""
    if key != "reward":
        return list(arms)
    keys = sorted({k for config in configs.values() for k in config if any(r in k for r in REWARD_SCALE_KEYS)})
    return [a for a in arms if a.name == baseline.name or not same_scale(configs, a.name, baseline.name, keys)]


def same_scale(configs: Mapping[str, Mapping[str, str]], arm: str, baseline: str, keys: Sequence[str]) -> list[str]:
    """The settings among ``keys`` (e.g. the reward functions) in which ``arm`` differs from
    ``baseline``: a metric they set the scale of is not compared between the two."""
    mine, theirs = configs.get(arm, {}), configs.get(baseline, {})
    return [k for k in keys if mine.get(k, "—") != theirs.get(k, "—")]


def comparison_section(doc: Doc, arms: Sequence[Arm], baseline: Arm, confidence: float, wall_clock_caveat: str | None,
                       configs: Mapping[str, Mapping[str, str]], margin: float = EQUIVALENCE_MARGIN,
                       target_mde: float = TARGET_MDE) -> None:  # fmt: skip
    doc.h(2, f"Effects against the baseline ({user_text(baseline.name)})")
    doc.p(
        f"Each arm minus **{user_text(baseline.name)}** at every seed both ran: the mean difference "
        f"[{confidence:.0%} t-interval], "
        "Cohen's d_z (mean / standard deviation of the seeds' differences), the paired t-test's p and Holm's correction "
        "over the arms compared, the equivalence test's p (TOST, Holm-corrected), the minimum detectable "
        f"effect (MDE) at 80% power [{confidence:.0%} interval] and P(arm > baseline): the share of seeds at which the arm "
        f"ended higher [{confidence:.0%} Wilson interval]. Where every paired run wrote its per-prompt outcomes "
        "(seeds column `n x P prompts`), the runs are paired by prompt too and the interval, tests and MDE are "
        "two-level: over new seeds and new prompts, from the variance between seeds and between prompts; elsewhere "
        f"(seeds column a number) they are over the seeds' final values. Differences below {PRACTICAL_ABSOLUTE:g} on "
        "accuracies and shares, or below "
        f"{PRACTICAL_RELATIVE:.0%} of the baseline's mean elsewhere, are not called better or worse; an arm is "
        f"equivalent when the test shows its difference within ±{margin:g} on accuracies and shares, or "
        f"±{margin * 100:g}% of the baseline's mean elsewhere; otherwise it is undetermined. The interval is for one "
        "comparison; the verdict follows the Holm-corrected p, so with many arms an interval can miss 0 while "
        "the verdict is undetermined. See Method for the formulas."
    )
    if len(arms) < 2:
        doc.p("Only one arm: nothing to compare.")
        return
    header = ["arm", "seeds", "difference", "d_z", "p", "p (Holm)", "p TOST (Holm)", "MDE", "P(arm > baseline)", "verdict"]
    for number, (key, label, direction) in enumerate(SUMMARY_METRICS):
        if wall_clock_caveat and key in WALL_CLOCK_METRICS:
            continue
        compared = comparable_arms(arms, baseline, key, configs)
        effects = baseline_effects(compared, baseline, key, direction, confidence, label, margin, target_mde)
        left_out = [a.name for a in arms if a not in compared]
        if (not effects and not left_out) or not baseline.finals(key):
            continue
        rows = [[f"**{user_text(e.arm)}**", pairs_text(e), difference_text(e), fmt(e.effect_size, 3), fmt_p(e.p), fmt_p(e.p_holm),
                 fmt_p(e.p_equivalence_holm), mde_text(e), improvement_text(e), e.verdict] for e in effects]  # fmt: skip
        title = f"{label} ({user_text(baseline.name)}: {fmt_metric(baseline.interval(key, confidence)[0], key)})"
        note = f"Not compared (other reward functions): {', '.join(map(user_text, left_out))}." if left_out else ""
        doubled = "; ".join(f"**{user_text(e.arm)}** {fmt(e.mde_doubled[0], 2)} and {fmt(e.mde_doubled[1], 2)}" for e in effects
                            if math.isfinite(e.mde_doubled[0]))  # fmt: skip
        if doubled:
            note += (" " if note else "") + f"The MDE of the design with twice the seeds, and with twice the prompts: {doubled}."
        needed = seeds_needed_text(effects, confidence) if number == 0 else ""
        if needed:
            note += (" " if note else "") + needed
        far = {a.name: far_seeds(a, key) for a in compared} if number == 0 else {}
        if any(far.values()):
            named = "; ".join(f"**{user_text(name)}** seed {', '.join(map(str, seeds))}" for name, seeds in far.items() if seeds)
            note += (" " if note else "") + (f"Seeds far from their arm's others (see Seeds): {named}. The comparisons "
                                             "that use them cover less than they say.")  # fmt: skip
        body = doc if number == 0 else Doc()
        if number == 0:
            doc.h(3, title)
        if rows:
            body.table(header, rows, "lrrrrrrrrl")
        if note:
            body.p(note)
        if number != 0:
            doc.details(title, body)
