"""Comparisons at matched compute: a run's val/accuracy at a budget of steps, generated tokens or
training FLOPs by hand, the seeds that fell short of it, and the paired difference to the baseline
at a common budget of a synthetic sweep (conftest's runs validate at 0, 3 and 6 optimizer steps
with 0.1, (0.1 + f) / 2 and f, after 0, 330 and 750 generated tokens times their ``token_scale``)."""

import math

import pytest

from grpo_lightning.report import Doc, discover_cells
from grpo_lightning.report.build import load_arms
from grpo_lightning.report.learning import budget_key, common_budget, round_budget, value_at
from grpo_lightning.report.render.markdown import render_markdown
from grpo_lightning.report.render.document import plain_text
from grpo_lightning.report.sections.budgets import (
    FIGURE,
    before_first_validation,
    budget_section,
    fractions_of,
    matched,
    verdict_changes,
)


def test_a_curve_is_linear_between_validations_and_never_extrapolated():
    x, y = [0, 100, 200], [0.2, 0.4, 0.3]
    assert value_at(x, y, 150) == pytest.approx(0.35)  # 0.4 + 50 / 100 * (0.3 - 0.4)
    assert value_at(x, y, 25) == pytest.approx(0.25)
    assert value_at(x, y, 0) == 0.2 and value_at(x, y, 200) == 0.3  # the validations themselves
    assert math.isnan(value_at(x, y, 200.5))  # past the last validation
    assert math.isnan(value_at([50, 100], [0.2, 0.4], 10))  # before the first
    assert value_at([0, 100, 100, 200], [0.2, 0.3, 0.5, 0.5], 50) == pytest.approx(0.35)  # the last value at x=100


def test_a_budget_is_rounded_down_to_three_significant_digits():
    assert round_budget(71_179) == 71_100
    assert round_budget(352) == 352
    assert round_budget(310_754_574_336) == 310_000_000_000
    assert fractions_of(210) == [52, 105, 157]  # a quarter, a half and three quarters, rounded down


def test_a_seed_short_of_the_budget_is_left_out_and_named(tmp_path, cell_writer):
    root = tmp_path / "sweep"
    cell_writer(root, "grpo", 0, 0.5)
    cell_writer(root, "grpo", 1, 0.6)
    cell_writer(root, "grpo", 2, 0.7, token_scale=0.8)  # validates after 264 and 600 tokens
    (arm,) = load_arms(discover_cells(root))
    key = budget_key("tokens", 700)
    assert key == "at_tokens@700:val/accuracy"
    values = arm.finals_by_seed(key)
    # between (330, (0.1 + f) / 2) and (750, f): (0.1 + f) / 2 + (700 - 330) / 420 * (f - 0.1) / 2
    assert values == pytest.approx({0: 0.3 + 370 / 420 * 0.2, 1: 0.35 + 370 / 420 * 0.25})
    assert str(arm.seed_count(key, "val/accuracy at 700 tokens")) == (
        "n=2 of 3; seed 2 ended at 600 generated tokens, short of 700"
    )
    assert common_budget([arm], "tokens") == 600  # the largest every seed reached
    assert math.isnan(common_budget([arm], "flops"))  # not recorded


def _sweep(root, cell_writer, flops=True):
    """grpo spends the default tokens, dapo twice as many per step, and learns more per step."""
    for seed, (f_grpo, f_dapo) in enumerate([(0.5, 0.6), (0.6, 0.75), (0.7, 0.9)]):
        cell_writer(root, "grpo", seed, f_grpo, flops_per_token=1000 if flops else None)
        cell_writer(root, "dapo", seed, f_dapo, token_scale=2.0, flops_per_token=1000 if flops and seed < 2 else None)
    return load_arms(discover_cells(root))


def test_the_paired_difference_at_matched_tokens(tmp_path, cell_writer):
    grpo, dapo = _sweep(tmp_path / "sweep", cell_writer)
    assert common_budget([grpo, dapo], "tokens") == 750  # grpo's end; dapo validated at 660 and 1500
    (effect,) = matched([grpo, dapo], grpo, "tokens", 750).effects
    # dapo at 750 tokens: (0.1 + f) / 2 + (750 - 660) / 840 * (f - 0.1) / 2; grpo at its final f
    at_budget = [(0.1 + f) / 2 + 90 / 840 * (f - 0.1) / 2 for f in (0.6, 0.75, 0.9)]
    d = [a - g for a, g in zip(at_budget, (0.5, 0.6, 0.7))]  # -0.1232, -0.1402, -0.1571
    assert effect.differences == pytest.approx(d)
    sd = abs(d[1] - d[0])  # equally spaced: the standard deviation is the spacing
    t = sum(d) / 3 / (sd / math.sqrt(3))
    assert effect.mean == pytest.approx(sum(d) / 3) and effect.t == pytest.approx(t)
    assert effect.p == pytest.approx(1 - abs(t) / math.sqrt(2 + t * t))  # Student's t with 2 degrees of freedom
    assert effect.verdict == "worse"
    # at equal steps dapo is ahead at every seed: 0.1, 0.15 and 0.2
    steps = matched([grpo, dapo], grpo, "step", common_budget([grpo, dapo], "step"))
    assert steps.effects[0].differences == pytest.approx([0.1, 0.15, 0.2]) and steps.effects[0].verdict == "better"
    assert plain_text(verdict_changes([steps, matched([grpo, dapo], grpo, "tokens", 750)])) == (
        "At matched compute the verdicts on val/accuracy differ: **dapo** is better at 6 optimizer steps, worse at "
        "750 generated tokens (see Effects at matched compute)."
    )


def test_a_seed_without_flops_is_named_and_older_runs_say_not_recorded(tmp_path, cell_writer):
    arms = _sweep(tmp_path / "new", cell_writer)
    doc = Doc()
    budget_section(doc, arms, arms[0], 0.95, tmp_path)
    md = render_markdown(doc)
    assert "| arm | at 6 optimizer steps | at 750 generated tokens | at 750,000 training FLOPs |" in md
    assert "2 of 3 (seed 2: dapo did not record perf/flops)" in md
    assert (tmp_path / FIGURE).is_file()
    old = _sweep(tmp_path / "old", cell_writer, flops=False)
    doc = Doc()
    budget_section(doc, old, old[0], 0.95, tmp_path)
    md = render_markdown(doc)
    assert "| arm | at 6 optimizer steps | at 750 generated tokens | training FLOPs |" in md
    assert "Training FLOPs are not recorded: no run logged `perf/flops`" in md


def test_a_budget_before_every_first_validation_is_not_compared(tmp_path, cell_writer):
    grpo, dapo = _sweep(tmp_path / "sweep", cell_writer)
    # a quarter of 6 steps, 1, lies between the start (0.1 at every seed of every arm) and the first validation at
    # step 3 ((0.1 + f) / 2): each seed is at 0.1 + (f - 0.1) / 6, so dapo - grpo = (f_dapo - f_grpo) / 6, a third of
    # step 3's (f_dapo - f_grpo) / 2 at every seed: the same t, p and d_z, nothing of its own
    early, first = (matched([grpo, dapo], grpo, "step", b).effects[0] for b in (1, 3))
    assert early.differences == pytest.approx([d / 3 for d in first.differences])
    assert early.differences == pytest.approx([(0.6 - 0.5) / 6, (0.75 - 0.6) / 6, (0.9 - 0.7) / 6])
    assert (early.p, early.effect_size) == pytest.approx((first.p, first.effect_size))
    assert fractions_of(6) == [1, 3, 4]
    assert before_first_validation([grpo, dapo], "step", 1)
    assert not before_first_validation([grpo, dapo], "step", 3) and not before_first_validation([grpo, dapo], "step", 4)
    # tokens: grpo validates first at 330, dapo at 660; 187 (a quarter of 750) lies before both, 375 after grpo's
    assert fractions_of(750) == [187, 375, 562]
    assert before_first_validation([grpo, dapo], "tokens", 187)
    assert not before_first_validation([grpo, dapo], "tokens", 375)
    assert not before_first_validation([grpo, dapo], "tokens", 8000)  # no run has a value there
    doc = Doc()
    budget_section(doc, [grpo, dapo], grpo, 0.95, tmp_path)
    md = render_markdown(doc)
    assert "#### At 1 optimizer steps" not in md and "#### At 187 generated tokens" not in md
    assert "#### At 3 optimizer steps" in md and "#### At 375 generated tokens" in md
    assert "<summary>At ½ and ¾ of 6 optimizer steps</summary>" in md
    assert ("Not compared at 1 optimizer steps (¼ of 6 optimizer steps): before every run's first validation after "
            "the start, each seed's value there is interpolated from the start") in md  # fmt: skip
