"""The two-level statistics of an arm against the baseline (seeds x prompts): small examples worked
by hand, and their coverage at nominal 95% simulated with fixed generators (``benchmarks/interval_coverage.py``),
where the figures the report's Method quotes are checked against a rerun."""

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from grpo_lightning.report.paired import (
    Components,
    components,
    design_mde,
    improvement_probability,
    interquartile_mean,
    outlying_seeds,
    seeds_for_mde,
    two_level_equivalence,
    two_level_interval,
    two_level_test,
)
from grpo_lightning.report.sections.method import COVERAGE, COVERAGE_SIMULATIONS, DETECTION, SPREAD_DETECTION
from grpo_lightning.report.statistics import detectable_shift, seed_interval, wilson_interval

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "interval_coverage.py"
_spec = importlib.util.spec_from_file_location("interval_coverage", SCRIPT)
simulation = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = simulation
_spec.loader.exec_module(simulation)

# Three seeds x four prompts of differences, worked by hand:
#   seed 0: 1 0 1 0 (mean 0.5)   seed 1: 1 1 1 0 (0.75)   seed 2: 0 0 1 0 (0.25)   grand mean 0.5
#   prompt means 2/3 1/3 1 0; every entry is 0.5 from the grand mean, so the total sum of squares is 12 x 0.25 = 3
#   SS_seed = 4 (0 + 0.0625 + 0.0625) = 0.5            MS_seed = 0.5 / 2 = 0.25
#   SS_prompt = 3 (1/36 + 1/36 + 1/4 + 1/4) = 5/3      MS_prompt = (5/3) / 3 = 5/9 = 0.5555556
#   SS_residual = 3 - 0.5 - 5/3 = 5/6                   MS_residual = (5/6) / 6 = 5/36 = 0.1388889
#   sigma2_prompt = (5/9 - 5/36) / 3 = 5/36; se^2 = 0.25 / 12 + (5/36) / 4 = 1/48 + 5/144 = 1/18, se = 0.2357023
#   dof = (1/18)^2 / ((1/48)^2 / 2 + (5/108)^2 / 3 + (5/432)^2 / 6) = 288/89 = 3.2359551
#   t = 0.5 / se = 1.5 sqrt(2) = 2.1213203
D = np.array([[1, 0, 1, 0], [1, 1, 1, 0], [0, 0, 1, 0]], dtype=float)


def test_the_variance_components_and_the_two_level_interval_by_hand():
    c = components(D)
    assert (c.ms_seed, c.ms_prompt, c.ms_residual) == pytest.approx((0.25, 5 / 9, 5 / 36))
    assert c.seed_variance == pytest.approx(0.25 / 4) and c.prompt_variance == pytest.approx(5 / 36)
    result = two_level_test(D, np.zeros_like(D))
    assert (result.mean, result.se, result.dof, result.t) == pytest.approx((0.5, math.sqrt(1 / 18), 288 / 89, 1.5 * math.sqrt(2)))
    half = stats.t.ppf(0.975, 288 / 89) * math.sqrt(1 / 18)
    assert (result.low, result.high) == pytest.approx((0.5 - half, 0.5 + half))
    assert result.p == pytest.approx(2 * stats.t.sf(1.5 * math.sqrt(2), 288 / 89))
    # the same tables shifted alike on both sides: only the difference counts
    assert two_level_test(D + 3.0, np.full_like(D, 3.0)).mean == pytest.approx(0.5)


def test_without_a_prompt_level_variance_it_is_the_t_interval_over_seeds():
    # both prompts have mean 2/3, so MS_prompt = 0 < MS_residual: the interval is the seeds' (0.5, 0.5, 1) exactly
    d = np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    mean, low, high, _, dof = two_level_interval(d)
    assert dof == 2 and (mean, low, high) == pytest.approx(seed_interval([0.5, 0.5, 1.0]))


def test_equivalence_within_the_margin_by_hand():
    result = two_level_test(D, np.zeros_like(D))
    # margin 0.6: p_high = P(T < (0.5 - 0.6) / se) = P(T < -0.4242641) on 288/89 dof; p_low is far smaller
    assert two_level_equivalence(result, 0.6) == pytest.approx(stats.t.cdf(-0.1 / math.sqrt(1 / 18), 288 / 89))
    assert math.isnan(two_level_equivalence(result, 0.0))
    assert math.isnan(two_level_equivalence(two_level_test(np.ones((3, 4)), np.zeros((3, 4))), 0.1))  # no spread
    # 0.3 - 0.25, 0.6 - 0.55 and 0.7 - 0.65 are 0.05 up to rounding (5.6e-17 apart): no spread to test against
    rounded = two_level_test(np.repeat([[0.3], [0.6], [0.7]], 4, axis=1), np.repeat([[0.25], [0.55], [0.65]], 4, axis=1))
    assert math.isnan(rounded.p) and rounded.low == rounded.high == rounded.mean


def _shift(dof: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The noncentrality at which the two-sided t-test on ``dof`` rejects with probability ``power``,
    solved here on scipy's noncentral t apart from the library's solver."""
    from scipy import optimize

    critical = stats.t.ppf(1 - alpha / 2, dof)
    return optimize.brentq(lambda shift: stats.nct.sf(critical, dof, shift)
                           + np.nan_to_num(stats.nct.cdf(-critical, dof, shift)) - power, 0.1, 1e4, xtol=1e-14)  # fmt: skip


def _power(delta: float, se: float, dof: float, alpha: float = 0.05) -> float:
    critical = stats.t.ppf(1 - alpha / 2, dof)
    return stats.nct.sf(critical, dof, delta / se) + np.nan_to_num(stats.nct.cdf(-critical, dof, delta / se))


def test_the_two_level_mde_has_80_percent_power_on_the_noncentral_t():
    result = two_level_test(D, np.zeros_like(D))
    # se = sqrt(1/18) = 0.2357023 on 288/89 = 3.2359551 dof: the noncentrality of 80% power at level 0.05 is 4.0997772
    # (the shortcut t(0.975) + t(0.8) = 3.6 + 0.92 = 4.0224076 would give 0.9480897 and 77.8% power)
    assert _shift(288 / 89) == pytest.approx(4.0997772, abs=1e-6)
    mde = design_mde(result)[0]
    assert mde == pytest.approx(4.0997772 * math.sqrt(1 / 18), abs=1e-6) == pytest.approx(0.9663267, abs=1e-6)
    assert _power(mde, result.se, result.dof) == pytest.approx(0.8, abs=1e-9)
    assert _power(4.0224076 * math.sqrt(1 / 18), result.se, result.dof) < 0.79
    # at Holm's level for six arms, as the report's Effects: the test's own alpha in the noncentral t too
    holm = design_mde(result, alpha=0.05 / 6)[0]
    assert _power(holm, result.se, result.dof, 0.05 / 6) == pytest.approx(0.8, abs=1e-9)


def test_the_mde_of_the_design_and_its_chi_square_interval():
    result = two_level_test(D, np.zeros_like(D))
    factor = _shift(288 / 89)
    mde, low, high = design_mde(result)
    assert mde == pytest.approx(factor * math.sqrt(1 / 18))  # at the design run, the interval's se
    assert (low, high) == pytest.approx((mde * math.sqrt(288 / 89 / stats.chi2.ppf(0.975, 288 / 89)),
                                         mde * math.sqrt(288 / 89 / stats.chi2.ppf(0.025, 288 / 89))))  # fmt: skip
    # sigma2_seed = (0.25 - 5/36) / 4 = 1/36. Twice the seeds: sqrt(1/36 / 6 + 5/36 / 24 + 5/36 / 4) = 0.2124591
    # (the seed term 0.25 / (4 x 3) halved), on dof' = (288/89) (6 - 1) / (3 - 1); twice the prompts:
    # sqrt(1/36 / 3 + 5/36 / 24 + 5/36 / 8) = 0.1800206 on the run's dof
    doubled = _shift(288 / 89 * 5 / 2)
    assert doubled == pytest.approx(3.1957038, abs=1e-6)
    assert design_mde(result, seeds=6)[0] == pytest.approx(doubled * 0.2124591, abs=1e-6)
    assert design_mde(result, prompts=8)[0] == pytest.approx(factor * 0.1800206, abs=1e-6)
    assert design_mde(result, alpha=0.025)[0] > mde  # Holm's first level, for two arms
    # seeds that agree better than the prompts' noise predicts (MS_seed 0 < MS_residual): sigma2_seed is negative,
    # the MDE at the design run stays the interval's se, and twice the prompts leave no positive variance
    agreeing = two_level_test(np.array([[1.0, 0.0], [0.0, 1.0]]), np.zeros((2, 2)))
    assert agreeing.se == 0 and math.isnan(design_mde(agreeing)[0])
    steady = two_level_test(np.array([[1, 1, 0, 1, 0, 0], [1, 0, 1, 1, 0, 0], [0, 1, 1, 1, 0, 0]]), np.zeros((3, 6)))
    factor = _shift(steady.dof)
    assert (steady.components.ms_seed, steady.components.ms_residual) == pytest.approx((0, 0.2))  # every seed 0.5
    assert design_mde(steady)[0] == pytest.approx(factor * steady.se)
    # v stays se^2 with more seeds (the seed terms cancel); only dof' grows, to dof (6 - 1) / (3 - 1)
    assert design_mde(steady, seeds=6)[0] == pytest.approx(_shift(steady.dof * 5 / 2) * steady.se)


# The seeds for a target MDE on the 3 x 4 example, P' = P = 4: v(S') = (1/36) / S' + (5/36) / (4 S') + (5/36) / 4
# = 1 / (16 S') + 5/144 (at S' = 3: 1/18 = se^2), dof' = (288/89) (S' - 1) / 2, MDE(S') = lambda(dof') sqrt(v(S'));
# unlimited seeds leave the normal test's lambda 2.8015818 (Phi(l - 1.96) + Phi(-l - 1.96) = 0.8) times
# sqrt(5/144) = 0.1863390: 0.5220439. At the upper bound, the seeds' term 1 / (16 S') widens by dof / chi2(0.025, dof)
# = 11.946724 and sigma2_prompt = 5/36 goes to its own upper bound: Satterthwaite's dof_p = (15/36)^2 / ((5/9)^2 / 3
# + (5/36)^2 / 6) = 18/11 gives (5/36) (18/11) / chi2(0.025, 18/11) = 11.119077, more than MS_prompt's own bound
# (5/9) 3 / (3 chi2(0.025, 3)) = 2.5744564, which holds whatever sigma2_residual is; 2.8015818 sqrt(2.5744564 / 4)
# = 2.2475848 (where the interval's chi-square on the whole, as before, gave sqrt(11.946724) 0.5220 = 1.8044).
def _projected_mde(seeds: int, widening: float = 1.0, prompt_variance: float = 5 / 36) -> float:
    dof = 288 / 89 * (seeds - 1) / 2
    return _shift(dof) * math.sqrt(widening / (16 * seeds) + prompt_variance / 4)


def test_the_prompt_variance_has_its_own_upper_bound():
    result = two_level_test(D, np.zeros_like(D))
    c = result.components
    assert c.prompt_dof == pytest.approx(18 / 11)
    assert c.prompt_variance_upper() == pytest.approx(2.5744564, abs=1e-6)  # MS_prompt's bound, below Satterthwaite's
    # the SmolLM2 variants' dr_grpo against grpo (4 seeds x 500 prompts): MS_prompt 0.1724208, MS_residual 0.1255297,
    # sigma2_prompt 0.0117228 on Satterthwaite's dof_p = 0.0021989 / (0.0297289 / 499 + 0.0157577 / 1497) = 31.364837:
    # upper bound 0.0117228 x 31.364837 / chi2(0.025, 31.364837) = 0.0206417 (MS_prompt's own gives 0.0489968); with
    # Holm's level for 6 arms the prompts' term alone gives 3.4798785 sqrt(0.0206417 / 500) = 0.0223590, not the
    # 0.0595 the overall dof of 3.17 (set by the seeds) made of it
    arm = Components(4, 500, 1.694, 0.1724208416833667, 0.12552972611890448)
    assert arm.prompt_dof == pytest.approx(31.364837, abs=1e-5)
    assert arm.prompt_variance_upper() == pytest.approx(0.0206417, abs=1e-7)
    assert detectable_shift(math.inf, 0.05 / 6) == pytest.approx(3.4798785, abs=1e-6)
    # no positive estimate (MS_prompt <= MS_residual): Satterthwaite has nothing, MS_prompt's bound remains
    flat = Components(4, 500, 1.0, 0.1, 0.2)
    assert flat.prompt_dof == 0 and flat.prompt_variance_upper() == pytest.approx(0.1 * 499 / (4 * stats.chi2.ppf(0.025, 499)))


def test_the_seeds_for_a_target_mde_by_hand():
    result = two_level_test(D, np.zeros_like(D))
    widening = 288 / 89 / stats.chi2.ppf(0.025, 288 / 89)
    assert _projected_mde(10) == pytest.approx(0.6081, abs=1e-4) and _projected_mde(11) == pytest.approx(0.5995, abs=1e-4)
    plan = seeds_for_mde(result, 0.6)
    assert plan.seeds == next(s for s in range(2, 10_001) if _projected_mde(s) <= 0.6) == 11
    assert (plan.floor, plan.upper_floor) == pytest.approx((0.5220439, 2.2475848))
    assert plan.upper is None and not plan.upper_reachable  # the upper bound's prompt term alone is 2.25 > 0.6
    wide = seeds_for_mde(result, 2.5)
    expected = next(s for s in range(2, 10_001) if _projected_mde(s, widening, 2.5744564) <= 2.5)
    assert (wide.seeds, wide.upper) == (2, expected) and wide.upper_reachable
    assert _projected_mde(expected - 1, widening, 2.5744564) > 2.5
    # twice the prompts: v(S') = (1/36) / S' + (5/36) / (8 S') + (5/36) / 8, and the prompt term alone halves
    doubled = seeds_for_mde(result, 0.6, prompts=8)
    assert doubled.floor == pytest.approx(0.5220439 / math.sqrt(2)) and doubled.seeds < plan.seeds


def test_at_the_seeds_run_the_projection_is_the_designs_mde():
    result = two_level_test(D, np.zeros_like(D))
    mde = design_mde(result)[0]
    assert _projected_mde(3) == pytest.approx(mde)
    # the run's own MDE as the target: the run's 3 seeds, not one fewer
    assert seeds_for_mde(result, mde).seeds == 3
    assert seeds_for_mde(result, mde * (1 - 1e-9)).seeds == 4
    # at the upper bound: the seeds' term widened by the interval's chi-square, the prompts' at their own bound
    high = _projected_mde(3, 288 / 89 / stats.chi2.ppf(0.025, 288 / 89), 2.5744564)
    assert seeds_for_mde(result, high * (1 + 1e-7)).upper == 3 and seeds_for_mde(result, high * (1 - 1e-7)).upper == 4


def test_no_number_of_seeds_reaches_a_target_below_the_prompts_term():
    result = two_level_test(D, np.zeros_like(D))
    unreachable = seeds_for_mde(result, 0.5)  # below 0.5220439: only more prompts help
    assert unreachable.seeds is None and not unreachable.reachable
    capped = seeds_for_mde(result, 0.53, max_seeds=20)  # reachable, but beyond 20 seeds
    assert capped.seeds is None and capped.reachable and capped.max_seeds == 20
    assert seeds_for_mde(result, 0.53).seeds == next(s for s in range(2, 10_001) if _projected_mde(s) <= 0.53)
    # no positive variance at any count (MS_seed = MS_prompt = 0), and no positive target: no estimate
    assert seeds_for_mde(two_level_test(np.array([[1.0, 0.0], [0.0, 1.0]]), np.zeros((2, 2))), 0.1) is None
    assert seeds_for_mde(result, 0.0) is None


def test_the_probability_of_improvement_counts_ties_half():
    # wins at seeds 0, 3 and 4, a tie at seed 2: 3.5 of 5
    p, low, high = improvement_probability([0.1, -0.05, 0.0, 0.2, 0.3])
    assert p == 0.7 and (low, high) == pytest.approx(wilson_interval(3.5, 5))
    assert improvement_probability([0.1, 0.2, 0.3])[1:] == pytest.approx(wilson_interval(3, 3))
    assert all(math.isnan(v) for v in improvement_probability([]))


def test_the_interquartile_mean_drops_a_quarter_from_each_end():
    assert interquartile_mean([1, 2, 3, 4, 100]) == 3.0  # floor(5 / 4) = 1 from each end
    assert interquartile_mean(range(1, 9)) == 4.5  # 2 from each end: 3, 4, 5, 6
    assert interquartile_mean([0.2, 0.5, 0.3]) == pytest.approx(1 / 3)  # three seeds: none dropped
    assert interquartile_mean([1, 2, 3, 4, 100]) == pytest.approx(stats.trim_mean([1, 2, 3, 4, 100], 0.25))


def test_a_seed_far_from_the_others_is_named():
    # seed 4: the other four have mean 0.315 and s = 0.0129099; r = 0.295 / (0.0129099 sqrt(1.25)) = 20.4,
    # beyond t(1 - 0.05 / 10, 3) = 5.8409
    assert outlying_seeds([0.30, 0.32, 0.31, 0.33, 0.02]) == [4]
    assert outlying_seeds([0.30, 0.32, 0.31, 0.33, 0.28]) == []
    assert outlying_seeds([0.30, 0.32, 0.02]) == []  # three seeds: no check
    # 0.31 is 14.7 of the others' scale away, but less than the floor from their mean (0.3005)
    assert outlying_seeds([0.300, 0.301, 0.300, 0.301, 0.310]) == [4]
    assert outlying_seeds([0.300, 0.301, 0.300, 0.301, 0.310], floor=0.01) == []


def _tolerance(p: float, *simulations: int) -> float:
    """Four binomial standard errors of a share ``p`` (of a difference of shares, given two counts)."""
    return 4 * math.sqrt(p * (1 - p) * sum(1 / n for n in simulations))


SIMULATIONS = 2000


@pytest.mark.parametrize("seeds", simulation.SEEDS)
@pytest.mark.parametrize("scenario", ["normal, seeds dominate", "normal, prompts dominate", "skewed"])
def test_the_two_level_interval_covers_95_percent_where_its_assumptions_hold(scenario, seeds):
    found = simulation.coverage(scenario, seeds, SIMULATIONS, methods=("two-level t",), seed=1)["two-level t"]
    assert abs(found - 0.95) <= _tolerance(0.95, SIMULATIONS), found


def test_with_collapsing_seeds_it_covers_less_and_the_collapsed_seed_is_named():
    found = simulation.coverage("collapse", 5, SIMULATIONS, methods=("two-level t",), seed=1)["two-level t"]
    assert found < 0.95 - _tolerance(0.95, SIMULATIONS), found
    named, false = simulation.collapse_detection(10, 1000, seed=1)
    assert named >= 0.9 and false <= 0.05 + _tolerance(0.05, 1000), (named, false)
    # two or more collapsed seeds hide each other from the check of one seed; the check of the whole arm finds them
    one, whole, false = simulation.several_collapse_detection(10, 1000, seed=1)
    assert one <= 0.05 and whole >= 0.85 and false <= 0.05 + _tolerance(0.05, 1000), (one, whole, false)


def test_the_coverage_the_method_quotes_matches_a_rerun():
    assert {key for key in COVERAGE} == {(s, n) for s in simulation.SCENARIOS for n in simulation.SEEDS}
    rerun = 300
    for (scenario, seeds), quoted in COVERAGE.items():
        found = simulation.coverage(scenario, seeds, rerun, resamples=200, seed=2)
        for method, value in zip(simulation.METHODS, quoted):
            assert abs(found[method] - value) <= _tolerance(_inside(value), rerun, COVERAGE_SIMULATIONS), \
                (scenario, seeds, method, found[method], value)  # fmt: skip
    for detection, measure, measured_at in ((DETECTION, simulation.collapse_detection, simulation.DETECTION_SEEDS),
                                            (SPREAD_DETECTION, simulation.several_collapse_detection,
                                             simulation.SPREAD_SEEDS)):  # fmt: skip
        assert set(detection) == set(measured_at)
        for seeds, quoted in detection.items():
            found = measure(seeds, rerun, seed=2)
            spread = [_tolerance(_inside(q), rerun, COVERAGE_SIMULATIONS) for q in quoted]
            assert all(abs(f - q) <= s for f, q, s in zip(found, quoted, spread)), (seeds, found)


def _inside(p: float) -> float:
    """``p`` kept off 0 and 1, where a share's binomial spread would vanish."""
    return min(max(p, 0.05), 0.95)
