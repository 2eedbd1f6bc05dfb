"""A report's data folder keeps each cell's per-prompt validation outcomes, and the loader gives
every run's final validation by prompt, refusing cells whose prompts differ at an index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from grpo_lightning.ablation.runs import Run, Series

from grpo_lightning.errors import ConfigError
from grpo_lightning.evaluation.outcomes import (
    OUTCOMES_FOLDER,
    PromptOutcomes,
    outcome_rows,
    outcomes_path,
    prompt_hash,
    write_outcomes,
)
from grpo_lightning.report.cells import discover_cells
from grpo_lightning.report.data import export_data
from grpo_lightning.report.outcomes import cell_outcomes
from grpo_lightning.report.sections.finals import run_accuracy_interval

PROMPTS = ["1+1=", "2+3=", "4+4="]


def write_validation(directory, step: int, correct: list[list[float]], prompts=PROMPTS) -> None:
    """One validation's outcomes file of ``[P, n]`` scores (rewards: twice the scores)."""
    rewards = [[2 * score for score in row] for row in correct]
    rows = outcome_rows("", range(len(prompts)), [prompt_hash(p) for p in prompts], rewards, correct, step)
    write_outcomes(rows, outcomes_path(directory, "val", step))


def test_the_export_copies_the_outcomes_and_the_loader_reads_each_runs_final_validation(tmp_path, cell_writer):
    sweep = tmp_path / "sweep"
    first, second = cell_writer(sweep, "grpo", 0, 0.5), cell_writer(sweep, "grpo", 1, 0.6)
    cell_writer(sweep, "dapo", 0, 0.4)  # a run from before outcomes were written
    write_validation(first, 2, [[0, 0], [1, 0], [0, 0]])
    write_validation(first, 5, [[1, 1], [1, 0], [0, 1]])
    write_validation(second, 5, [[0, 1], [1, 1], [0, 0]])
    export_data(sweep, discover_cells(sweep), tmp_path / "data", "outcomes", [])

    copied = sorted(p.name for p in (tmp_path / "data" / "grpo-seed0" / OUTCOMES_FOLDER).iterdir())
    assert copied == ["val-step000002.csv.gz", "val-step000005.csv.gz"]
    assert not (tmp_path / "data" / "dapo-seed0" / OUTCOMES_FOLDER).exists()
    loaded = cell_outcomes(discover_cells(tmp_path / "data"))
    assert sorted(loaded) == ["grpo-seed0", "grpo-seed1"]
    final = loaded["grpo-seed0"]
    assert final.step == 5 and final.prompt.tolist() == [0, 1, 2]
    np.testing.assert_array_equal(final.correct, [[1, 1], [1, 0], [0, 1]])
    np.testing.assert_array_equal(final.reward, [[2, 2], [2, 0], [0, 2]])
    assert final.prompt_hash.tolist() == [prompt_hash(p) for p in PROMPTS]


def test_a_cell_validated_on_the_prompts_in_another_order_is_refused(tmp_path, cell_writer):
    sweep = tmp_path / "sweep"
    write_validation(cell_writer(sweep, "grpo", 0, 0.5), 5, [[1], [0], [0]])
    write_validation(cell_writer(sweep, "dapo", 0, 0.5), 5, [[1], [0], [0]], prompts=PROMPTS[::-1])
    with pytest.raises(ConfigError, match=r"prompt 0 .* cells 'dapo-seed0' and 'grpo-seed0' \(prompt hashes differ\)"):
        cell_outcomes(discover_cells(sweep))


def outcome_sweep(root, cell_writer, seeds=(0, 1, 2), without=()) -> None:
    """grpo right on the first 6 + s of 20 prompts at seed s, dapo on the first 10 + s: dapo gains 0.2
    at every seed, on prompts 6 + s to 9 + s; ``without``: cells that wrote no outcomes."""
    prompts = [f"{i}+{i}=" for i in range(20)]
    for variant, right in (("grpo", 6), ("dapo", 10)):
        for seed in seeds:
            correct = [[1.0] if i < right + seed else [0.0] for i in range(20)]
            directory = cell_writer(root, variant, seed, (right + seed) / 20)
            if f"{variant}-seed{seed}" not in without:
                write_validation(directory, 6, correct, prompts)


def test_the_effect_on_val_accuracy_is_paired_by_prompt_where_every_run_wrote_outcomes(tmp_path, cell_writer):
    from grpo_lightning.report import build_report
    from grpo_lightning.report.paired import two_level_test

    outcome_sweep(tmp_path / "sweep", cell_writer)
    loaded = cell_outcomes(discover_cells(tmp_path / "sweep"))
    tables = [np.stack([loaded[f"{v}-seed{s}"].correct[:, 0] for s in range(3)]) for v in ("dapo", "grpo")]
    result = two_level_test(*tables)
    # the seeds alone: 0.2 at every seed, no spread and no test; by prompt, dapo gains on 4 prompts of 20 at each seed
    assert result.mean == pytest.approx(0.2) and result.se > 0 and result.p < 0.05
    text = (build_report(tmp_path / "sweep", tmp_path / "report") / "report.md").read_text()
    effects = text.split("### final val/accuracy")[1].split("<details>")[0]
    row = f"| **dapo** | 3 x 20 prompts | +0.2 [{result.low:.4g}, {result.high:.4g}] |"
    assert row in effects and "| 1 [0.4385, 1] | better |" in effects  # wins at 3 of 3 seeds: Wilson [0.4385, 1]
    summary = text.split("## Summary")[1].split("## Runs")[0]
    assert f"**dapo** +0.2 [{result.low:.4g}, {result.high:.4g}] (seeds x 20 prompts), better (Holm p " in summary


def test_without_every_runs_outcomes_the_effect_falls_back_to_the_seeds(tmp_path, cell_writer):
    from grpo_lightning.report import build_report

    outcome_sweep(tmp_path / "sweep", cell_writer, without=("dapo-seed1",))
    text = (build_report(tmp_path / "sweep", tmp_path / "report") / "report.md").read_text()
    # TensorBoard keeps float32: the seeds' differences are 0.2 up to rounding, the interval zero-width
    assert "| **dapo** | 3 | +0.2 [0.2, 0.2] |" in text and "x 20 prompts" not in text


def test_two_seeds_with_outcomes_get_numbers_but_no_verdict(tmp_path, cell_writer):
    from grpo_lightning.report import build_report

    outcome_sweep(tmp_path / "sweep", cell_writer, seeds=(0, 1))
    text = (build_report(tmp_path / "sweep", tmp_path / "report") / "report.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| **dapo** | 2 x 20 prompts |"))
    assert row.endswith("| too few seeds (n=2; 3 needed) |")


def test_a_report_whose_cells_validated_on_other_prompts_pairs_by_seed_only_and_says_why(tmp_path, cell_writer):
    from grpo_lightning.report import build_report

    outcome_sweep(tmp_path / "sweep", cell_writer)
    write_validation(tmp_path / "sweep" / "dapo-seed2", 7, [[1.0]] * 20, [f"other {i}" for i in range(20)])
    text = (build_report(tmp_path / "sweep", tmp_path / "report") / "report.md").read_text()
    assert "Per-prompt outcomes are not used, comparisons are over seeds only: outcomes: prompt 0 of the validation" in text
    assert "| **dapo** | 3 | +" in text and "x 20 prompts" not in text


def test_the_effects_give_the_seeds_for_the_target_mde(tmp_path, cell_writer):
    from grpo_lightning.report import build_report
    from grpo_lightning.report.paired import seeds_for_mde, two_level_test

    outcome_sweep(tmp_path / "sweep", cell_writer)
    loaded = cell_outcomes(discover_cells(tmp_path / "sweep"))
    result = two_level_test(*[np.stack([loaded[f"{v}-seed{s}"].correct[:, 0] for s in range(3)]) for v in ("dapo", "grpo")])
    plan = seeds_for_mde(result, 0.2)  # one arm compared: level 0.05
    assert plan.seeds == 10 and not plan.upper_reachable and round(plan.upper_floor, 2) == 0.32
    effects = (build_report(tmp_path / "sweep", tmp_path / "wide", target_mde=0.2) / "report.md").read_text()
    assert ("Seeds for an MDE of 0.2 with these 20 prompts (one arm compared): **dapo** 10 (not reachable at the "
            "variance's upper 95% bound, where the prompts' variance alone gives an MDE of 0.32).") in effects  # fmt: skip
    # the default target, 0.04, lies below what the 20 prompts' variance alone allows (0.2)
    default = (build_report(tmp_path / "sweep", tmp_path / "default") / "report.md").read_text()
    assert ("Seeds for an MDE of 0.04 with these 20 prompts (one arm compared): **dapo** not reachable with 20 "
            "prompts (the prompts' variance alone gives an MDE of 0.2: more prompts are needed).") in default  # fmt: skip
    assert "Seeds for a target MDE δ* (0.04 on accuracies and shares" in default


def test_a_runs_accuracy_interval_comes_from_its_outcomes_where_it_wrote_them():
    def series(value: float) -> Series:
        return Series(np.array([10]), np.array([value]), np.array([0.0]))

    # 40 of 100 greedy answers right; the run logged a bootstrap interval, too narrow, [0.31, 0.49]
    run = Run(Path("."), {"val/accuracy": series(0.4), "val/accuracy_ci_low": series(0.31), "val/accuracy_ci_high": series(0.49)})
    correct = np.array([[1.0]] * 40 + [[0.0]] * 60)
    outcomes = PromptOutcomes(10, np.arange(100), np.array(["h"] * 100), correct, correct)
    assert run_accuracy_interval({}, run, 0.95, outcomes) == pytest.approx((0.303295, 0.502791), abs=1e-6)
    assert run_accuracy_interval({}, run, 0.95) == (0.31, 0.49)  # no outcomes: the logged interval
    # outcomes of another validation than the final value's are not used
    assert run_accuracy_interval({}, run, 0.95, PromptOutcomes(5, np.arange(100), np.array(["h"] * 100), correct * 0,
                                                               correct * 0)) == (0.31, 0.49)  # fmt: skip
