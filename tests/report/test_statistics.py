"""The statistics behind every interval and comparison of a report: their coverage and power
measured by simulation (fixed generators, so the tests are deterministic), and small examples
worked by hand."""

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from grpo_lightning.ablation.runs import Run, Series
from grpo_lightning.report import Arm, CellInfo, baseline_effects, seed_interval
from grpo_lightning.report.sections.comparisons import equivalence_margin, identical_arms
from grpo_lightning.report.statistics import equivalence_test, minimum_detectable_effect, paired_test, standardised_effect

SIMULATIONS = 4000


def _coverage(draw, true_mean: float, seeds: int, rng: np.random.Generator) -> float:
    hits = 0
    for _ in range(SIMULATIONS):
        _, low, high = seed_interval(draw(rng, seeds))
        hits += low <= true_mean <= high
    return hits / SIMULATIONS


# Normal seeds, and the accuracy of a run over 100 validation prompts at p = 0.2 (a binomial
# proportion: bounded and skewed); the standard error of each coverage is about 0.35 points.
DISTRIBUTIONS = {
    "normal": (lambda rng, n: rng.normal(0.3, 0.05, n), 0.3),
    "accuracy over 100 prompts": (lambda rng, n: rng.binomial(100, 0.2, n) / 100, 0.2),
}


@pytest.mark.parametrize("seeds", [3, 5, 10])
@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
def test_seed_intervals_cover_95_percent(distribution, seeds):
    draw, true_mean = DISTRIBUTIONS[distribution]
    coverage = _coverage(draw, true_mean, seeds, np.random.default_rng(seeds))
    assert 0.93 <= coverage <= 0.97, coverage


def test_seed_interval_by_hand():
    # mean 0.6, s = 0.1, se = 0.1 / sqrt(3) = 0.0577350; t(0.975, 2) = 4.3026527: half-width 0.2484138
    mean, low, high = seed_interval([0.5, 0.6, 0.7])
    assert mean == pytest.approx(0.6)
    assert (low, high) == pytest.approx((0.6 - 0.2484138, 0.6 + 0.2484138), abs=1e-6)
    # 90%: t(0.95, 2) = 2.9199856, half-width 0.1685851
    assert seed_interval([0.5, 0.6, 0.7], confidence=0.90)[1] == pytest.approx(0.6 - 0.1685851, abs=1e-6)
    # with 3 seeds the interval is far wider than their range (the percentile bootstrap gave [0.5, 0.7])
    assert low < 0.5 and high > 0.7
    one = seed_interval([0.4])
    assert one[0] == 0.4 and math.isnan(one[1]) and math.isnan(one[2])  # one seed: no interval
    assert all(math.isnan(v) for v in seed_interval([]))
    assert seed_interval([0.25, 0.25, 0.25]) == (0.25, 0.25, 0.25)  # all seeds equal: zero width
    # n = 4: values 1, 2, 3, 6: mean 3, s^2 = 14 / 3, se = sqrt(14 / 12) = 1.0801234; t(0.975, 3) = 3.1824463
    assert seed_interval([1, 2, 3, 6])[2] == pytest.approx(3 + 3.4374349, abs=1e-6)


def test_an_arm_interval_is_clipped_to_the_range_of_the_quantity():
    # skewed accuracies: 0.2 -+ 2.776445 * 0.4472136 / sqrt(5) = [-0.3553, 0.7553], clipped below at 0
    mean, low, high = _arm("grpo", [0.0, 0.0, 0.0, 0.0, 1.0]).interval("val/accuracy")
    assert (mean, low) == (0.2, 0.0) and high == pytest.approx(0.7552890, abs=1e-6)


# A small paired example worked by hand (and checked with scipy.stats.ttest_rel):
#   arm      0.30 0.35 0.28 0.40 0.33
#   baseline 0.25 0.30 0.27 0.31 0.30
#   d        0.05 0.05 0.01 0.09 0.03     mean 0.046
#   d - mean 0.004 0.004 -0.036 0.044 -0.016, squares sum to 0.00352; s_d^2 = 0.00352 / 4 = 0.00088
#   s_d = 0.0296648, se = s_d / sqrt(5) = 0.0132665, t = 0.046 / 0.0132665 = 3.467380 with 4 dof
#   p = 2 P(T_4 > 3.467380) = 0.0256447; d_z = 0.046 / 0.0296648 = 1.550660
#   interval: 0.046 -+ t(0.975, 4) 2.7764451 x 0.0132665 = 0.046 -+ 0.0368337 = [0.0091663, 0.0828337]
ARM = [0.30, 0.35, 0.28, 0.40, 0.33]
BASELINE = [0.25, 0.30, 0.27, 0.31, 0.30]


def test_paired_test_effect_size_and_interval_by_hand():
    d = np.subtract(ARM, BASELINE)
    t, p = paired_test(d)
    assert t == pytest.approx(3.467380, abs=1e-6) and p == pytest.approx(0.0256447, abs=1e-7)
    reference = stats.ttest_rel(ARM, BASELINE)
    assert (t, p) == pytest.approx((reference.statistic, reference.pvalue))
    assert standardised_effect(d) == pytest.approx(1.550660, abs=1e-6)
    assert seed_interval(d)[1:] == pytest.approx((0.0091663, 0.0828337), abs=1e-7)
    assert all(math.isnan(v) for v in paired_test([0.1, 0.1, 0.1]))  # no spread: no test
    assert all(math.isnan(v) for v in paired_test([0.1]))


@pytest.mark.parametrize(("pairs", "alpha"), [(3, 0.05), (5, 0.05), (5, 0.0125), (10, 0.005)])
def test_the_minimum_detectable_effect_is_found_80_percent_of_the_time(pairs, alpha):
    sd = 0.03
    mde = minimum_detectable_effect(sd, pairs, alpha)
    rng = np.random.default_rng(pairs)
    d = rng.normal(mde, sd, size=(20_000, pairs))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(pairs))
    power = float((2 * stats.t.sf(np.abs(t), pairs - 1) < alpha).mean())
    assert 0.79 <= power <= 0.81, power
    by_hand = (stats.t.ppf(1 - alpha / 2, pairs - 1) + stats.t.ppf(0.8, pairs - 1)) * sd / math.sqrt(pairs)
    assert by_hand <= mde <= 1.2 * by_hand  # the textbook formula comes close, from below
    assert math.isnan(minimum_detectable_effect(sd, 1)) and math.isnan(minimum_detectable_effect(0.0, 5))


def _arm(name: str, values, tag: str = "val/accuracy") -> Arm:
    """An arm whose seed s ended ``values[s]`` on ``tag``."""
    cells = [CellInfo(Path(name), f"{name}-seed{s}", name, name, s, {}, True, {}) for s in range(len(values))]
    runs = [Run(Path(name), {tag: Series(np.array([0, 1]), np.array([0.1, v]), np.array([0.0, 1.0]))}) for v in values]
    return Arm(name, cells, runs)


def test_verdicts_against_the_baseline_follow_the_holm_corrected_paired_test():
    baseline, better = _arm("grpo", BASELINE), _arm("dapo", ARM)
    alone = baseline_effects([baseline, better], baseline, "val/accuracy", direction=1)
    assert [(e.arm, e.n, e.verdict) for e in alone] == [("dapo", 5, "better")]
    assert (alone[0].mean, alone[0].p, alone[0].p_holm) == pytest.approx((0.046, 0.0256447, 0.0256447), abs=1e-6)
    assert alone[0].effect_size == pytest.approx(1.550660, abs=1e-6)
    # the MDE is proportional to s_d: its interval is the chi-square one of s_d, sqrt(4 / chi2(0.975, 4) = 11.143287)
    # = 0.5991331 and sqrt(4 / chi2(0.025, 4) = 0.4844186) = 2.8735556 times the MDE; the arm is higher at 5 of 5 seeds
    assert alone[0].mde_interval == pytest.approx((0.5991331 * alone[0].mde, 2.8735556 * alone[0].mde), rel=1e-6)
    assert alone[0].improvement == pytest.approx((1.0, 0.5655175, 1.0), abs=1e-6)
    # the same arm beside a second one: Holm doubles the smaller p (0.0513 > 0.05), and the MDE is at 0.05 / 2
    flat = _arm("rloo", [0.27, 0.27, 0.28, 0.31, 0.29])  # d = 0.02 -0.03 0.01 0 -0.01: p = 0.8276
    two = baseline_effects([baseline, better, flat], baseline, "val/accuracy", direction=1)
    assert [e.p_holm for e in two] == pytest.approx([0.0512894, 0.8275647], abs=1e-6)
    assert two[0].mde == pytest.approx(minimum_detectable_effect(0.0296648, 5, 0.025), abs=1e-6)
    assert two[0].mde == pytest.approx(0.0608, abs=1e-4)
    assert two[0].verdict == "undetermined (MDE 0.061)"
    assert two[1].verdict.startswith("undetermined (MDE ")
    # lower is better: the same differences are "worse"
    assert baseline_effects([baseline, better], baseline, "val/accuracy", direction=-1)[0].verdict == "worse"
    assert not any("tie" in e.verdict for e in two)


# Equivalence by hand, at the margin 0.02. Both examples have mean(d) = 0.005 and n = 5 (4 dof).
#   close: d = 0.015 -0.005 0.005 0.010 0.000; d - mean = 0.01 -0.01 0 0.005 -0.005, squares sum to 0.00025,
#          s_d^2 = 0.0000625, s_d = 0.0025 sqrt(10), se = s_d / sqrt(5) = 0.0025 sqrt(2) = 0.00353553
#          t_low = (0.005 + 0.02) / se = 5 sqrt(2) = 7.0710678, t_high = (0.005 - 0.02) / se = -3 sqrt(2) = -4.2426407
#          With 4 dof, P(T <= t) = 1/2 + 3/8 x (1 - t^2 / (12 (1 + t^2 / 4))), x = t / sqrt(1 + t^2 / 4):
#          t_high: t^2 = 18, x = -4.2426407 / sqrt(5.5) = -1.8090681, 1 - 18 / 66 = 0.7272727,
#          p_high = 1/2 + 3/8 (-1.3156859) = 0.0066178; p_low = P(T > 7.07) is far smaller: p = 0.0066178.
#          90% interval: 0.005 -+ t(0.95, 4) 2.1318468 x 0.00353553 = [-0.0025373, 0.0125373], inside +-0.02.
#          Paired test: t = 0.005 / se = 1.4142136, p = 0.2302: no difference found.
#   wide:  d = 0.005 + 10 (d_close - 0.005) = 0.105 -0.095 0.005 0.055 -0.045: se = 0.025 sqrt(2) = 0.0353553
#          t_high = -0.015 / se = -0.3 sqrt(2) = -0.4242641: t^2 = 0.18, x = -0.4242641 / sqrt(1.045) = -0.4150287,
#          1 - 0.18 / 12.54 = 0.9856459, p_high = 1/2 + 3/8 (-0.4090713) = 0.3465983; t_low = 0.5 sqrt(2) has
#          p_low = 0.2593 (smaller): p = 0.3465983. 90% interval [-0.0704, 0.0804]: far outside +-0.02.
CLOSE = [0.015, -0.005, 0.005, 0.010, 0.000]
WIDE = [0.105, -0.095, 0.005, 0.055, -0.045]


def test_equivalence_test_by_hand():
    assert equivalence_test(CLOSE, 0.02) == pytest.approx(0.0066178, abs=1e-7)
    assert equivalence_test(WIDE, 0.02) == pytest.approx(0.3465983, abs=1e-7)
    # p < 0.05 exactly when the 90% interval lies inside the margin: its edge, 0.0125373, is the margin where p = 0.05
    assert equivalence_test(CLOSE, 0.0125373) == pytest.approx(0.05, abs=1e-5)
    assert seed_interval(CLOSE, confidence=0.90)[1:] == pytest.approx((-0.0025373, 0.0125373), abs=1e-7)
    assert math.isnan(equivalence_test([0.01, 0.01, 0.01], 0.02))  # no spread: no test
    assert math.isnan(equivalence_test([0.01], 0.02)) and math.isnan(equivalence_test(CLOSE, 0.0))


def _against_grpo(differences, tag: str = "val/accuracy", base: float = 0.3) -> Arm:
    return _arm("dapo", [base + d for d in differences], tag)


def test_an_arm_whose_90_percent_interval_lies_inside_the_margin_is_equivalent():
    baseline = _arm("grpo", [0.3] * 5)
    (effect,) = baseline_effects([baseline, _against_grpo(CLOSE)], baseline, "val/accuracy", direction=1)
    assert effect.p_holm == pytest.approx(0.2302, abs=1e-4)  # no difference found ...
    assert effect.p_equivalence_holm == pytest.approx(0.0066178, abs=1e-6)  # ... and none of 0.02 or more
    assert effect.verdict == "equivalent (±0.02)"
    # a stricter margin than the interval's edge (0.0125): the same data no longer shows equivalence
    (strict,) = baseline_effects([baseline, _against_grpo(CLOSE)], baseline, "val/accuracy", 1, margin=0.012)
    assert strict.verdict.startswith("undetermined (MDE ")


def test_an_arm_with_a_wide_interval_is_undetermined_with_its_mde():
    baseline = _arm("grpo", [0.3] * 5)
    (effect,) = baseline_effects([baseline, _against_grpo(WIDE)], baseline, "val/accuracy", direction=1)
    assert effect.p_equivalence_holm == pytest.approx(0.3465983, abs=1e-6)
    # MDE: (t(0.975, 4) 2.7764451 + t(0.8, 4) 0.9409646) x 0.0353553 = 0.1314 by hand, 0.1330 on the noncentral t
    assert effect.mde == pytest.approx(minimum_detectable_effect(0.0790569, 5), abs=1e-6)
    assert effect.verdict == "undetermined (MDE 0.13)"


def test_a_clear_difference_is_better_or_worse_even_within_the_margin():
    # d = 0.012 +- 0.001: the paired test rejects and 0.012 reaches the practical threshold (0.01), while
    # its 90% interval also lies inside +-0.02: a difference found is reported, not equivalence
    d = [0.011, 0.013, 0.012, 0.0115, 0.0125]
    baseline = _arm("grpo", [0.3] * 5)
    (up,) = baseline_effects([baseline, _against_grpo(d)], baseline, "val/accuracy", direction=1)
    assert up.p_holm < 1e-4 and up.p_equivalence_holm < 0.05 and up.verdict == "better"
    (down,) = baseline_effects([baseline, _against_grpo([-x for x in d])], baseline, "val/accuracy", direction=1)
    assert down.verdict == "worse"


def test_holm_corrects_the_equivalence_p_over_the_arms_compared():
    # the two arms' p: 0.0066178 and 0.3465983; Holm: 2 x 0.0066178 = 0.0132356, then max(0.0132356, 0.3465983)
    baseline = _arm("grpo", [0.3] * 5)
    close, wide = _arm("close", [0.3 + d for d in CLOSE]), _arm("wide", [0.3 + d for d in WIDE])
    effects = baseline_effects([baseline, close, wide], baseline, "val/accuracy", direction=1)
    assert [e.p_equivalence_holm for e in effects] == pytest.approx([0.0132356, 0.3465983], abs=1e-6)
    assert [e.verdict.split(" (")[0] for e in effects] == ["equivalent", "undetermined"]


def test_the_margin_is_absolute_on_proportions_and_relative_to_the_baseline_elsewhere():
    assert equivalence_margin("val/accuracy", 0.3, 0.02) == 0.02
    assert equivalence_margin("clip_ratio/region", 0.3, 0.05) == 0.05
    assert equivalence_margin("kl", 0.5, 0.02) == pytest.approx(0.01)  # 2% of the baseline's KL
    assert equivalence_margin("reward", -2.0, 0.02) == pytest.approx(0.04)
    assert equivalence_margin("perf/generated_tokens", 100_000, 0.02) == pytest.approx(2_000)
    # a reward: CLOSE is within 2% of a baseline reward of 1.0 (+-0.02), not of one of 0.1 (+-0.002)
    for base, expected in ((1.0, "equivalent (±0.02)"), (0.1, "undetermined")):
        baseline = _arm("grpo", [base] * 5, "val/reward")
        (effect,) = baseline_effects([baseline, _against_grpo(CLOSE, "val/reward", base)], baseline, "val/reward", 1)
        assert effect.verdict.startswith(expected)


def test_too_few_seeds_get_no_verdict_even_when_equivalent():
    baseline = _arm("grpo", [0.3] * 2)
    (effect,) = baseline_effects([baseline, _against_grpo([0.001, 0.0012])], baseline, "val/accuracy", direction=1)
    assert effect.verdict == "too few seeds (n=2; 3 needed)"


def test_verdicts_without_a_test_or_below_the_practical_threshold():
    baseline = _arm("grpo", BASELINE)
    same = _arm("grpo+r1", BASELINE)
    shifted = _arm("shifted", [v + 0.005 for v in BASELINE[:4]] + [BASELINE[4] + 0.006])
    single = _arm("one", [0.5])
    effects = {e.arm: e for e in baseline_effects([baseline, same, shifted, single], baseline, "val/accuracy", 1)}
    assert effects["grpo+r1"].verdict == "identical at every seed"
    # differences 0.005 .. 0.006: significant (p < 0.0001), yet below one point of accuracy
    assert effects["shifted"].p_holm < 0.05 and effects["shifted"].verdict == "below the practical threshold (0.01)"
    assert effects["one"].verdict == "too few seeds (n=1; 3 needed)"
    assert identical_arms([baseline, same, shifted]) == [("grpo", "grpo+r1")]


def test_final_validations_at_different_steps_are_flagged():
    from grpo_lightning.report.render.document import plain_text
    from grpo_lightning.report.sections.summary import flag_sentences

    def arm(name, last_val_step):  # 100 training steps; the last validation after step last_val_step + 1
        cells = [CellInfo(Path(name), f"{name}-seed{s}", name, name, s, {}, True, {}) for s in range(2)]
        runs = [Run(Path(name), {"val/accuracy": Series(np.array([24, last_val_step]), np.array([0.3, 0.4 + s / 10]),
                                                       np.array([0.0, 1.0]))}, update_steps=np.arange(100))
                for s in range(2)]  # fmt: skip
        return Arm(name, cells, runs)

    grpo, dapo = arm("grpo", 99), arm("dapo", 87)
    assert dapo.finals("step_of:val/accuracy") == [88.0, 88.0]
    assert [plain_text(sentence) for sentence in flag_sentences([grpo, dapo], grpo)] == [
        "**Warning:** the final val/accuracy was taken at different training steps (**grpo** 100; **dapo** 88): "
        "arms validated at an earlier step had less training when compared."
    ]
    assert not any("different training steps" in f for f in flag_sentences([grpo, arm("rloo", 99)], grpo))
