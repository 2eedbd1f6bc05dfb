"""Arms (the runs of one setting over seeds), their final metrics, and how arms compare."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from grpo_lightning.report.cells import CellInfo
from grpo_lightning.report.metrics import metric_bounds
from grpo_lightning.report.runs import Run
from grpo_lightning.report.statistics import bootstrap_ci, holm, welch_dof, welch_test


def final_value(run: Run, key: str) -> float:
    """A run's final value of a metric key of ``FINAL_METRICS``."""
    if key.startswith("initial:"):
        return run.initial.get(key.split(":", 1)[1], math.nan)
    if key.startswith("gain:"):
        tag = key.split(":", 1)[1]
        return final_value(run, tag) - run.initial.get(tag, math.nan)
    if key == "train_time_s":
        return run.train_time_s
    if key == "steps":
        return run.optimizer_steps()
    if key == "batches":
        return run.generation_batches()
    series = run.scalars.get(key)
    if series is None or not len(series.values):
        return math.nan
    return float(series.values[-1])


@dataclass
class Arm:
    name: str
    cells: list[CellInfo]
    runs: list[Run]

    def finals(self, key: str) -> list[float]:
        return [v for v in (final_value(r, key) for r in self.runs) if math.isfinite(v)]

    def interval(self, key: str, confidence: float = 0.95) -> tuple[float, float, float]:
        """``(mean, low, high)`` of the final ``key`` over seeds: a percentile bootstrap of the
        mean, inside the range the metric can take (``metrics.metric_bounds``)."""
        return bootstrap_ci(self.finals(key), confidence, metric_bounds(key))


def pairwise_rows(arms: Sequence[Arm], key: str = "val/accuracy") -> list[dict[str, Any]]:
    """Welch tests of every pair of arms on a final metric, with Holm-adjusted p-values."""
    rows = []
    for a, b in combinations(arms, 2):
        x, y = a.finals(key), b.finals(key)
        t, p = welch_test(x, y)
        rows.append(
            {"a": a.name, "b": b.name, "n_a": len(x), "n_b": len(y),
             "mean_a": float(np.mean(x)) if x else math.nan, "mean_b": float(np.mean(y)) if y else math.nan,
             "t": t, "dof": welch_dof(x, y), "p": p, "x": x, "y": y}
        )  # fmt: skip
    for row, adjusted in zip(rows, holm([r["p"] for r in rows])):
        row["p_holm"] = adjusted
        row["verdict"] = _verdict(row)
    return rows


def _verdict(row: Mapping[str, Any]) -> str:
    if min(row["n_a"], row["n_b"]) < 2:
        return "n too small for a test (needs at least 2 seeds per arm)"
    if not math.isfinite(row["p"]):
        return "no variance within either arm: test undefined"
    caution = " (n=2 per arm: low power)" if min(row["n_a"], row["n_b"]) < 3 else ""
    if row["p"] < 0.05:
        holm_note = "" if row["p_holm"] < 0.05 else ", not after Holm correction"
        return f"significant at 0.05{holm_note}{caution}"
    return f"not significant at 0.05{caution}"


#: Above this many arms the report turns wide: arms become rows ranked by final val/accuracy, the
#: pairwise table keeps the significant pairs (all of them in a collapsed section) and the curves
#: are drawn in groups.
WIDE = 6


def ranked(arms: Sequence[Arm], key: str = "val/accuracy") -> list[int]:
    """Indices of ``arms``, the highest mean final ``key`` first (arms without it last, in table order)."""

    def score(i: int) -> float:
        values = arms[i].finals(key)
        return -float(sum(values) / len(values)) if values else math.inf

    return sorted(range(len(arms)), key=score)


@dataclass
class Ranking:
    """Arms with a final ``key``, best first (``scored``); the best and the arms that tie with it
    (``tied``); the Welch tests of every pair (``rows``); each arm's ``(mean, low, high)``."""

    scored: list[Arm]
    tied: list[Arm]
    rows: list[dict[str, Any]]
    intervals: dict[str, tuple[float, float, float]]


def rank_arms(arms: Sequence[Arm], key: str, direction: int, confidence: float = 0.95) -> Ranking | None:
    """The best arm on ``key`` and the arms that tie with it; None with fewer than two arms.

    Another arm ties with the best unless their difference is significant after Holm's correction
    over every pair of arms (Welch's test), or their intervals do not overlap.
    """
    scored = [a for a in arms if a.finals(key)]
    if len(scored) < 2 or direction == 0:
        return None
    intervals = {a.name: a.interval(key, confidence) for a in scored}
    scored.sort(key=lambda a: -direction * intervals[a.name][0])  # stable: ties keep the table order
    rows = pairwise_rows(scored, key)
    best = scored[0]
    tied = [best] + [a for a in scored[1:] if not _separated(intervals[best.name], intervals[a.name], pair_row(rows, best, a))]
    return Ranking(scored, tied, rows, intervals)


def pair_row(rows: Sequence[Mapping[str, Any]], a: Arm, b: Arm) -> Mapping[str, Any]:
    """The row of ``pairwise_rows`` that compares ``a`` and ``b``."""
    return next(r for r in rows if {r["a"], r["b"]} == {a.name, b.name})


def _separated(best: tuple[float, float, float], other: tuple[float, float, float], row: Mapping[str, Any]) -> bool:
    if math.isfinite(row["p_holm"]) and row["p_holm"] < 0.05:
        return True
    bounds = (best[1], best[2], other[1], other[2])
    if not all(math.isfinite(v) for v in bounds):
        return False
    return best[2] < other[1] or other[2] < best[1]
