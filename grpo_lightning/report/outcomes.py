"""Each run's per-prompt outcomes of its final validation (:mod:`grpo_lightning.evaluation.outcomes`),
for statistics paired by prompt: every cell of a sweep validates on the same prompts; and the
``[seeds, prompts]`` score tables of an arm and the baseline that :mod:`~grpo_lightning.report.paired` compares."""

from __future__ import annotations

import re
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from grpo_lightning.errors import ConfigError
from grpo_lightning.evaluation.outcomes import OUTCOMES_FOLDER, PromptOutcomes, read_outcomes
from grpo_lightning.report.arms import Arm, seed_order
from grpo_lightning.report.cells import CellInfo, log_file


def outcomes_folder(directory: Path) -> Path | None:
    """The ``outcomes/`` folder a run wrote beside its logs (:func:`~grpo_lightning.report.cells.log_file`);
    None when the run has none."""
    return log_file(directory, OUTCOMES_FOLDER, exists=Path.is_dir)


def copy_outcomes(directory: Path, target: Path) -> None:
    """Copy a run's ``outcomes/`` folder, if it has one, to ``target/outcomes``."""
    folder = outcomes_folder(directory)
    if folder is not None:
        shutil.copytree(folder, Path(target) / OUTCOMES_FOLDER)


def final_outcomes(directory: Path, prefix: str = "val", set_name: str = "") -> PromptOutcomes | None:
    """The outcomes of set ``set_name`` in the run's last validation logged under ``prefix`` (the
    highest step); None when the run wrote none (runs from before they were written)."""
    folder = outcomes_folder(directory)
    pattern = re.compile(rf"{re.escape(prefix)}-step(\d+)\.csv\.gz")
    files = {int(m.group(1)): path for path in folder.iterdir() if (m := pattern.fullmatch(path.name))} if folder else {}
    return read_outcomes(files[max(files)], set_name) if files else None


def cell_outcomes(cells: Sequence[CellInfo], prefix: str = "val", set_name: str = "") -> dict[str, PromptOutcomes]:
    """Per cell name, the outcomes of its final validation (:func:`final_outcomes`), cells without
    any left out. Refused when a prompt index holds another prompt in two cells: their validation
    sets differ or are in another order, so pairing by prompt would compare different prompts."""
    found = {cell.name: outcomes for cell in cells if (outcomes := final_outcomes(cell.directory, prefix, set_name))}
    first: dict[int, tuple[str, str]] = {}  # prompt index: its hash and the cell it was first seen in
    for name, outcomes in found.items():
        for prompt, digest in zip(outcomes.prompt.tolist(), outcomes.prompt_hash.tolist()):
            seen_hash, seen_in = first.setdefault(prompt, (digest, name))
            if seen_hash != digest:
                raise ConfigError(
                    f"outcomes: prompt {prompt} of the validation set differs between cells {seen_in!r} and {name!r} "
                    "(prompt hashes differ): their validation sets differ or are in another order; validate every cell "
                    "with the same data.* settings, on the same prompts in the same order"
                )
    return found


#: The metric whose per-prompt scores the outcomes hold: ``val/accuracy`` is the mean of ``correct``.
OUTCOME_METRIC = "val/accuracy"


def score_tables(arm: Arm, baseline: Arm, key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """``(arm, baseline)`` scores ``[S, P]`` of ``key`` at the seeds both have a final value of, in
    seed order, on the prompts every one of those runs validated on: each prompt's mean ``correct``
    over its samples. None where ``key`` is not val/accuracy, below two seeds or prompts, or where a
    run lacks outcomes or its outcomes do not give its final val/accuracy (then the report falls
    back to the seeds' final values)."""
    mine, theirs = arm.finals_by_seed(key), baseline.finals_by_seed(key)
    seeds = sorted(set(mine) & set(theirs), key=seed_order)
    if key != OUTCOME_METRIC or len(seeds) < 2:
        return None
    runs = [(side.outcomes.get(seed), final[seed]) for seed in seeds for side, final in ((arm, mine), (baseline, theirs))]
    if any(outcomes is None or abs(float(np.nanmean(outcomes.correct)) - value) > 1e-5 for outcomes, value in runs):
        return None
    shared = sorted(set.intersection(*(set(outcomes.prompt.tolist()) for outcomes, _ in runs)))
    scores = np.stack([_mean_scores(outcomes, shared) for outcomes, _ in runs])  # [2 S, P]: seed by seed, arm then baseline
    scores = scores[:, np.isfinite(scores).all(axis=0)]
    return (scores[0::2], scores[1::2]) if scores.shape[1] >= 2 else None


def _mean_scores(outcomes: PromptOutcomes, prompts: Sequence[int]) -> np.ndarray:
    rows = np.searchsorted(outcomes.prompt, prompts)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a prompt whose samples all lack a score: nan, dropped
        return np.nanmean(outcomes.correct[rows], axis=1)
