"""benchmarks/final_accuracy.py: the comparison of final accuracy from what a cell keeps of its final
validation is the report's, number for number, on the committed smollm2_variants data (real cells)."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path

import pytest

from grpo_lightning.report.build import attach_outcomes, baseline_arm, load_arms
from grpo_lightning.report.cells import discover_cells
from grpo_lightning.report.data import read_sweep_record
from grpo_lightning.report.sections.comparisons import baseline_effects

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "reports" / "smollm2_variants" / "data"
_spec = importlib.util.spec_from_file_location("final_accuracy", ROOT / "benchmarks" / "final_accuracy.py")
final_accuracy = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(final_accuracy)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12, abs=1e-15)


def test_the_effects_from_final_validations_alone_are_the_reports():
    cells = discover_cells(DATA)
    full = load_arms([c for c in cells if c.finished])
    attach_outcomes(full)
    mine = final_accuracy.load([DATA])
    assert [a.name for a in mine] == [a.name for a in full]
    chosen = final_accuracy.recorded_baseline([DATA])  # the joined sweep's, which its sweep.json names
    assert chosen == read_sweep_record(DATA)["baseline"] == "grpo"
    expected = baseline_effects(full, baseline_arm(full, cells, chosen), "val/accuracy", +1)
    found = baseline_effects(mine, baseline_arm(mine, cells, chosen), "val/accuracy", +1)
    assert len(found) == len(expected) == 6
    for e, f in zip(expected, found):
        assert e.two_level is not None and f.two_level is not None  # paired by seed and prompt in both
        assert (f.arm, f.n, f.verdict) == (e.arm, e.n, e.verdict)
        for field in ("mean", "low", "high", "p", "p_holm", "p_equivalence_holm", "mde"):
            assert _same(getattr(f, field), getattr(e, field)), (f.arm, field)
        assert f.seeds_needed.seeds == e.seeds_needed.seeds


@pytest.mark.parametrize("change", ["value", "step"])
def test_a_cell_whose_outcomes_are_not_its_final_validation_is_refused(tmp_path, change):
    source = next(d for d in sorted(DATA.iterdir()) if d.is_dir())
    cell = tmp_path / source.name
    shutil.copytree(source, cell)
    final_accuracy.final_only_run(cell)  # as kept: taken
    metrics = json.loads((cell / "metrics.json").read_text())
    if change == "value":
        metrics["final"]["val/accuracy"] += 0.01
    else:  # the last outcomes are of another validation than the final value's
        metrics["final_step"]["val/accuracy"] += 20
    (cell / "metrics.json").write_text(json.dumps(metrics))
    with pytest.raises(SystemExit, match="do not give its final val/accuracy"):
        final_accuracy.final_only_run(cell)


def test_the_table_names_each_arm_its_seeds_and_the_verdicts(capsys):
    final_accuracy.main([str(DATA)])
    text = capsys.readouterr().out
    assert "| grpo | n=14 | 0.591 [" in text and "14 x 500 prompts" in text and "undetermined (MDE" in text
    assert "| dapo | 14 x 500 prompts | +0.1119 [" in text and "| better |" in text  # against the recorded baseline
    # 0-3 predate the code record; dppo's 6 and 7 ran again at the later commit
    assert "99ec832: seeds 4, 5, 6, 7; b4d7953: seeds 6, 7, 8, 9, 10, 11, 12, 13; unrecorded: seeds 0, 1, 2, 3" in text
    # Wilcoxon's signed-rank over 4 seeds all of one sign: the exact p of 2 / 2^4, then Holm over the six arms
    assert final_accuracy.rank_test([0.1, 0.2, 0.3, 0.4]) == pytest.approx(0.125)
    assert math.isnan(final_accuracy.rank_test([0.0, 0.1]))  # one nonzero difference: no test
    assert "| rank test p (Holm) |" in text


def test_a_cell_given_twice_is_refused():
    with pytest.raises(Exception, match="(?i)duplicate|twice|more than once"):
        final_accuracy.load([DATA, DATA])


class _Finals:
    """An arm's final values by seed: all that ``seed_share`` reads of an arm."""

    def __init__(self, values):
        self.values = values

    def finals_by_seed(self, key):
        return dict(enumerate(self.values))


def test_what_a_seed_shares_across_arms_is_the_hand_computed_analysis_of_variance():
    # arm means 0.2, 0.3; seed means 0.15, 0.3, 0.3 around 0.25: MS(seed) = 2 (0.01 + 0.0025 + 0.0025) / 2 = 0.015;
    # residuals 0, +-0.05 (four of them): MS(residual) = 0.01 / 2 = 0.005; F = 3, p = 1 / (1 + F) for F(2, 2)
    component, residual, f, p, arms, seeds = final_accuracy.seed_share([_Finals([0.1, 0.3, 0.2]), _Finals([0.2, 0.3, 0.4])])
    assert (arms, seeds) == (2, 3)
    assert (component, residual, f, p) == pytest.approx((0.005, 0.005, 3.0, 0.25))
    # an arm without every seed is left out, and one arm alone gives nothing
    assert final_accuracy.seed_share([_Finals([0.1, 0.3, 0.2]), _Finals([0.2, 0.3])]) is None
    assert final_accuracy.seed_share([_Finals([0.1, 0.3]), _Finals([0.2, 0.4])]) is None  # no residual variance


def test_a_source_takes_the_seeds_after_its_at_sign(tmp_path):
    assert final_accuracy.source(str(DATA)) == (DATA, None)
    assert final_accuracy.source(f"{DATA}@0-2,5") == (DATA, {0, 1, 2, 5})
    arms = final_accuracy.load([final_accuracy.source(f"{DATA}@0-3")])
    assert all(sorted(arm.finals_by_seed(final_accuracy.KEY)) == [0, 1, 2, 3] for arm in arms)
    with pytest.raises(SystemExit, match="range"):
        final_accuracy.source(f"{DATA}@first")
