"""Arms (the runs of one setting over seeds), their final metrics, and how arms compare."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from grpo_lightning.evaluation.outcomes import PromptOutcomes
from grpo_lightning.report.cells import CellInfo
from grpo_lightning.report.learning import BUDGET_AXES, REACH_AXES, budget_reason, curve_value, is_curve_key, split_key
from grpo_lightning.report.metrics import metric_bounds
from grpo_lightning.ablation.runs import Run
from grpo_lightning.report.statistics import seed_interval


#: Training metrics are averaged over the rows logged in this many last optimizer steps.
SMOOTHING_STEPS = 10


def smoothed(key: str) -> bool:
    """Whether ``final_value`` averages ``key`` over the last ``SMOOTHING_STEPS`` optimizer steps:
    training scalars (not validation, not the cumulative perf/* counters, not computed keys)."""
    return ":" not in key and not key.startswith(("val/", "test/", "perf/")) and key not in ("train_time_s", "steps", "batches")


def final_value(run: Run, key: str) -> float:
    """A run's final value of a metric key of ``FINAL_METRICS``: the last validation for val/*,
    for training scalars the mean of the rows logged in the last ``SMOOTHING_STEPS`` optimizer steps
    (:func:`smoothing_window`)."""
    if key.startswith("initial:"):
        return run.initial.get(key.split(":", 1)[1], math.nan)
    if key.startswith("gain:"):
        tag = key.split(":", 1)[1]
        return final_value(run, tag) - run.initial.get(tag, math.nan)
    if is_curve_key(key):  # area under the val/accuracy curve, steps or tokens to a threshold
        return curve_value(run, key)
    if key.startswith("step_of:"):  # the training step at which the last value of a tag was logged
        series = run.scalars.get(key.split(":", 1)[1])
        return float(run.steps_done(series.steps[-1:])[0]) if series is not None and len(series.steps) else math.nan
    if key == "train_time_s":
        return run.train_time_s
    if key == "steps":
        return run.optimizer_steps()
    if key == "batches":
        return run.generation_batches()
    series = run.scalars.get(key)
    if series is None or not len(series.values):
        return math.nan
    if smoothed(key):
        return float(np.mean(series.values[smoothing_window(run, series.steps)]))
    return float(series.values[-1])


def smoothing_window(run: Run, tb_steps: np.ndarray) -> np.ndarray:
    """Which of a training scalar's rows (logged at ``tb_steps``) fall in the last ``SMOOTHING_STEPS``
    optimizer steps up to its last row: those whose optimizer steps taken (``Run.steps_done``) exceed the
    last row's by less than ``SMOOTHING_STEPS``. One row per optimizer step: the last ``SMOOTHING_STEPS``
    rows; one row per rollout of two optimizer steps: the last five."""
    done = run.steps_done(np.asarray(tb_steps))
    return done > done[-1] - SMOOTHING_STEPS


#: Why a cell of an arm counts in none of its numbers.
UNFINISHED = "unfinished (no DONE marker)"


@dataclass(frozen=True)
class SeedCount:
    """The seeds behind one number: ``used`` of ``total``, and why each seed left out is missing
    (``(seed, reason)`` in seed order)."""

    used: int
    total: int
    excluded: tuple[tuple[Any, str], ...] = ()

    def __str__(self) -> str:
        """``n=5``, or ``n=4 of 5; seed 3 diverged (final reward non-finite)``."""
        if not self.excluded:
            return f"n={self.used}"
        return f"n={self.used} of {self.total}; " + "; ".join(f"seed {seed} {why}" for seed, why in self.excluded)


def seed_order(seed: Any) -> tuple:
    """Integer seeds in order, others after them by their text."""
    return (not isinstance(seed, int), seed if isinstance(seed, int) else 0, str(seed))


def diverged(reason: str) -> bool:
    """Whether a reason of :func:`missing_reason` says the run diverged (rather than never logged the metric)."""
    return reason.startswith("diverged")


def missing_reason(run: Run, key: str, label: str) -> str:
    """Why ``run`` has no final ``key``: it logged the metric and ended non-finite (the run
    diverged), or it never logged it; for a budget key, why its curve has no value there."""
    if split_key(key)[0] in BUDGET_AXES:
        return budget_reason(run, key)
    tag = key.rpartition(":")[2]
    series = run.scalars.get(tag)
    logged = (series is not None and len(series.values) > 0) or (key.startswith("initial:") and tag in run.initial)
    return f"diverged (final {label} non-finite)" if logged else f"did not log {label}"


@dataclass
class Arm:
    name: str
    cells: list[CellInfo]
    runs: list[Run]
    #: The arm's cells without a ``DONE`` marker: counted among its seeds, in none of its numbers.
    unfinished: list[CellInfo] = field(default_factory=list)
    #: Per seed, the per-prompt outcomes of the run's final validation, where it wrote them.
    outcomes: dict[Any, PromptOutcomes] = field(default_factory=dict)

    def finals(self, key: str) -> list[float]:
        return [v for v in (final_value(r, key) for r in self.runs) if math.isfinite(v)]

    def finals_by_seed(self, key: str) -> dict[Any, float]:
        """The final ``key`` of each seed that has one."""
        values = {cell.seed: final_value(run, key) for cell, run in zip(self.cells, self.runs)}
        return {seed: v for seed, v in values.items() if math.isfinite(v)}

    def excluded_seeds(self, key: str, label: str) -> dict[Any, str]:
        """Each seed of the arm without a final ``key``, and why: unfinished, diverged or not logged.
        A threshold never reached (``inf``) is a value, not a lost seed."""
        reached = split_key(key)[0] in REACH_AXES
        excluded = {cell.seed: UNFINISHED for cell in self.unfinished}
        for cell, run in zip(self.cells, self.runs):
            value = final_value(run, key)
            if math.isnan(value) or (math.isinf(value) and not reached):
                excluded[cell.seed] = missing_reason(run, key, label)
        return excluded

    def seed_count(self, key: str | None = None, label: str = "") -> SeedCount:
        """The seeds behind the arm's final ``key`` (``None``: behind any of its numbers, its
        finished runs)."""
        excluded = self.excluded_seeds(key, label) if key is not None else {c.seed: UNFINISHED for c in self.unfinished}
        total = len(self.cells) + len(self.unfinished)
        ordered = tuple(sorted(excluded.items(), key=lambda item: seed_order(item[0])))
        return SeedCount(total - len(excluded), total, ordered)

    def partial_count(self, key: str, label: str) -> SeedCount | None:
        """The seeds behind the arm's final ``key`` where fewer seeds give it than the arm has finished
        runs; None where every run does, or where no run logged ``key`` (not a metric of this arm)."""
        count = self.seed_count(key, label)
        if count.used == len(self.runs) or (count.used == 0 and not any(diverged(why) for _, why in count.excluded)):
            return None
        return count

    def interval(self, key: str, confidence: float = 0.95) -> tuple[float, float, float]:
        """``(mean, low, high)`` of the final ``key`` over seeds: ``statistics.seed_interval``,
        clipped to the range the metric can take (``metrics.metric_bounds``; clipping never
        removes the true mean, so the coverage stays)."""
        mean, low, high = seed_interval(self.finals(key), confidence)
        lower, upper = metric_bounds(key)
        if math.isfinite(low):
            low, high = max(low, lower), min(high, upper)
        return (mean, low, high)


#: Above this many arms the report turns wide: arms become rows sorted by mean final
#: val/accuracy and the curves are drawn in groups.
WIDE = 6


def ranked(arms: Sequence[Arm], key: str = "val/accuracy") -> list[int]:
    """Indices of ``arms``, the highest mean final ``key`` first (arms without it last, in table
    order): an order for reading, not a claim that one arm beats the next."""

    def score(i: int) -> float:
        values = arms[i].finals(key)
        return -float(sum(values) / len(values)) if values else math.inf

    return sorted(range(len(arms)), key=score)
