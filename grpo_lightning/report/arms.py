"""Arms (the runs of one setting over seeds), their final metrics, and how arms compare."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from grpo_lightning.report.cells import CellInfo
from grpo_lightning.report.learning import curve_value, is_curve_key
from grpo_lightning.report.metrics import metric_bounds
from grpo_lightning.report.runs import Run
from grpo_lightning.report.statistics import seed_interval


#: Training metrics are averaged over this many last training steps: one step is one batch.
SMOOTHING_STEPS = 10


def smoothed(key: str) -> bool:
    """Whether ``final_value`` averages ``key`` over the last ``SMOOTHING_STEPS`` training steps:
    training scalars (not validation, not the cumulative perf/* counters, not computed keys)."""
    return ":" not in key and not key.startswith(("val/", "test/", "perf/")) and key not in ("train_time_s", "steps", "batches")


def final_value(run: Run, key: str) -> float:
    """A run's final value of a metric key of ``FINAL_METRICS``: the last validation for val/*,
    the mean of the last ``SMOOTHING_STEPS`` training steps for training scalars."""
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
        return float(np.mean(series.values[-SMOOTHING_STEPS:]))
    return float(series.values[-1])


@dataclass
class Arm:
    name: str
    cells: list[CellInfo]
    runs: list[Run]

    def finals(self, key: str) -> list[float]:
        return [v for v in (final_value(r, key) for r in self.runs) if math.isfinite(v)]

    def finals_by_seed(self, key: str) -> dict[Any, float]:
        """The final ``key`` of each seed that has one."""
        values = {cell.seed: final_value(run, key) for cell, run in zip(self.cells, self.runs)}
        return {seed: v for seed, v in values.items() if math.isfinite(v)}

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
