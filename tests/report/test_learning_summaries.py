"""How fast arms learned: the area under the val/accuracy curve and the steps and tokens to a
threshold, by hand, and as rows of the final-metrics table (CSV) of a synthetic sweep."""

import csv
import math

import pytest

from grpo_lightning.report import Doc, discover_cells
from grpo_lightning.report.build import load_arms
from grpo_lightning.report.sections.finals import final_section
from grpo_lightning.report.render.formatting import fmt_interval, fmt_metric
from grpo_lightning.report.learning import area_under_curve, curve_metrics, first_crossing, threshold_note
from grpo_lightning.report.render.markdown import render_markdown
from grpo_lightning.report.metrics import metric_bounds


def test_area_under_the_curve_is_the_trapezoid_mean_over_the_range():
    x, y = [0, 100, 200], [0.2, 0.4, 0.3]
    # (100 * (0.2 + 0.4) / 2 + 100 * (0.4 + 0.3) / 2) / 200 = (30 + 35) / 200
    assert area_under_curve(x, y, 0, 200) == pytest.approx(0.325)
    # ends interpolated: 0.3 at 50, 0.35 at 150; (50 * 0.35 + 50 * 0.375) / 100
    assert area_under_curve(x, y, 50, 150) == pytest.approx(0.3625)
    assert math.isnan(area_under_curve(x, y, 0, 250))  # the curve does not reach step 250
    assert math.isnan(area_under_curve(x, y, 100, 100))


def test_first_crossing_is_linear_between_points_and_inf_when_never_reached():
    x, y = [0, 100, 200], [0.2, 0.3, 0.5]
    assert first_crossing(x, y, 0.4) == pytest.approx(150)  # 100 + (0.4 - 0.3) / (0.5 - 0.3) * 100
    assert first_crossing(x, y, 0.3) == 100  # reached exactly at a point
    assert first_crossing(x, y, 0.1) == 0  # already there before training
    assert first_crossing([0, 100, 200], [0.2, 0.5, 0.1], 0.4) == pytest.approx(200 / 3)  # the first time, not the last
    assert first_crossing(x, y, 0.6) == math.inf
    assert math.isnan(first_crossing([], [], 0.4))


def test_curve_rows_keep_their_ranges_and_say_not_reached():
    assert metric_bounds("auc@0-400:val/accuracy") == (0.0, 1.0)
    assert metric_bounds("steps_to@0.33:val/accuracy") == (0.0, math.inf)
    assert fmt_metric(math.inf, "steps_to@0.33:val/accuracy") == "not reached"
    assert fmt_interval(math.inf, math.nan, math.nan, "tokens_to@0.33:val/accuracy") == "not reached by every seed"


def test_the_table_has_auc_and_steps_to_threshold_per_arm(tmp_path, cell_writer):
    """conftest's runs validate at optimizer steps 0, 3 and 6 with 0.1, (0.1 + f) / 2 and f (f: the
    final accuracy), after 0, 330 and 750 generated tokens."""
    root = tmp_path / "sweep"
    for seed in (0, 1, 2):
        cell_writer(root, "grpo", seed, 0.5 + 0.1 * seed)  # f = 0.5, 0.6, 0.7
        cell_writer(root, "dapo", seed, 0.3 + 0.1 * seed)  # f = 0.3, 0.4, 0.5
    arms = load_arms(discover_cells(root))
    assert [a.name for a in arms] == ["grpo", "dapo"]
    doc, rows = Doc(), curve_metrics(arms, arms[0])
    final_section(doc, arms, 0.95, tmp_path, "sweep", None, rows, threshold_note(rows, arms[0]))  # as build_report does
    with open(tmp_path / "final_metrics.csv") as f:
        rows = {(r["metric"], r["arm"]): r for r in csv.DictReader(f)}
    # AUC over steps 0-6: (3 (0.1 + (0.1 + f) / 2) / 2 + 3 ((0.1 + f) / 2 + f) / 2) / 6 = 0.05 + f / 2
    auc = "auc@0-6:val/accuracy"
    assert float(rows[auc, "grpo"]["mean"]) == pytest.approx(0.35, abs=1e-6)  # 0.3, 0.35, 0.4
    assert float(rows[auc, "dapo"]["mean"]) == pytest.approx(0.25, abs=1e-6)  # 0.2, 0.25, 0.3
    # t-interval over seeds: 0.35 -+ 4.303 * 0.05 / sqrt(3)
    assert float(rows[auc, "grpo"]["ci_low"]) == pytest.approx(0.35 - 4.3027 * 0.05 / math.sqrt(3), abs=1e-4)
    # threshold: halfway from grpo's start 0.1 to its mean final 0.6
    steps = "steps_to@0.35:val/accuracy"
    # f = 0.5: 3 + (0.35 - 0.3) / 0.2 * 3 = 3.75; f = 0.6: 3 (0.35 at step 3); f = 0.7: 0.25 / 0.3 * 3 = 2.5
    assert float(rows[steps, "grpo"]["mean"]) == pytest.approx((3.75 + 3 + 2.5) / 3, abs=1e-5)
    # f = 0.3 never reaches 0.35: no mean over the two seeds that did
    assert rows[steps, "dapo"]["mean"] == "inf" and rows[steps, "dapo"]["ci_low"] == ""
    tokens = "tokens_to@0.35:val/accuracy"
    assert float(rows[tokens, "grpo"]["mean"]) == pytest.approx((330 + 0.25 * 420 + 330 + 0.25 / 0.3 * 330) / 3, abs=0.1)
    md = render_markdown(doc)
    assert "from step 0 to step 6" in md and "The threshold 0.35 is halfway from **grpo**'s mean" in md
    assert "| optimizer steps to val/accuracy ≥ 0.35 | 3.083 [" in md
    assert "| not reached by every seed |" in md
    assert "| dapo-seed0 | 0 | 0.3 | 0.1 | 0.2 | not reached | not reached |" in md  # which seed, in Final values
