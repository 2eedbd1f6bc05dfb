"""A report's data folder keeps each cell's per-prompt validation outcomes, and the loader gives
every run's final validation by prompt, refusing cells whose prompts differ at an index."""

from __future__ import annotations

import numpy as np
import pytest

from grpo_lightning.errors import ConfigError
from grpo_lightning.evaluation.outcomes import OUTCOMES_FOLDER, outcome_rows, outcomes_path, prompt_hash, write_outcomes
from grpo_lightning.report.cells import discover_cells
from grpo_lightning.report.data import export_data
from grpo_lightning.report.outcomes import cell_outcomes

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
