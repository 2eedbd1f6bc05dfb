"""The summary paragraph: which arm leads on which metric, named only where the lead is real."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from grpo_lightning.report.arms import Arm, pair_row, rank_arms
from grpo_lightning.report.formatting import UNITS, fmt_metric, join_names, p_phrase
from grpo_lightning.report.metrics import SUMMARY_METRICS, WALL_CLOCK_METRICS

#: Tied arms named one by one up to this many; more are given as a count and a range.
TIE_NAMES = 4


def summary_paragraph(arms: Sequence[Arm], confidence: float = 0.95, wall_clock_caveat: str | None = None) -> str:
    """One sentence per metric of ``SUMMARY_METRICS``; ``wall_clock_caveat`` (why wall-clock
    times mean little on this machine) replaces the ranking of wall-clock metrics."""
    if not arms:
        return "No finished runs."
    seeds = sorted({len(a.runs) for a in arms})
    parts = [f"{len(arms)} arm{'s' if len(arms) != 1 else ''} with {'/'.join(map(str, seeds))} seed(s) each."]
    if len(arms) < 2:
        return parts[0] + " With a single arm there is no comparison."
    for key, label, superlative, direction in SUMMARY_METRICS:
        if key in WALL_CLOCK_METRICS and wall_clock_caveat:
            parts.append(f"The {label} is not compared: {wall_clock_caveat}")
            continue
        sentence = metric_sentence(arms, key, label, superlative, direction, confidence)
        if sentence:
            parts.append(sentence)
    initial = [v for a in arms for v in a.finals("initial:val/accuracy")]
    if initial:
        parts.append(f"Before training, val/accuracy was {fmt_metric(float(np.mean(initial)))}.")
    return " ".join(parts)


def metric_sentence(arms: Sequence[Arm], key: str, label: str, superlative: str, direction: int, confidence: float) -> str:
    """The leader on ``key``, or the arms that tie with the best one (``arms.rank_arms``)."""
    ranking = rank_arms(arms, key, direction, confidence)
    if ranking is None:
        return ""
    scored, tied, rows, intervals = ranking.scored, ranking.tied, ranking.rows, ranking.intervals
    best, others = scored[0], scored[1:]
    unit = UNITS.get(key, "")

    def value(arm: Arm) -> str:
        return fmt_metric(intervals[arm.name][0], key) + unit

    if len(tied) == 1:
        runner_up = others[0]
        return (
            f"**{best.name}** has the {superlative} {label} ({value(best)}), ahead of the runner-up "
            f"**{runner_up.name}** ({value(runner_up)}; {_why(pair_row(rows, best, runner_up))})."
        )
    if len(tied) > TIE_NAMES:
        values = f"from {value(tied[-1])} to {value(best)}" if direction > 0 else f"from {value(best)} to {value(tied[-1])}"
        who = f"All {len(tied)} arms" if len(tied) == len(scored) else f"{len(tied)} arms"
    else:
        values, who = ", ".join(value(a) for a in tied), join_names([a.name for a in tied])
    single = " (an arm with one seed has no interval and no test)" if any(len(a.finals(key)) < 2 for a in tied) else ""
    return (
        f"{who} tie for the {superlative} {label} ({values}): no difference to **{best.name}** is "
        f"significant after Holm's correction or larger than the intervals{single}."
    )


def _why(row: Mapping[str, Any]) -> str:
    if math.isfinite(row["p_holm"]) and row["p_holm"] < 0.05:
        return f"significant: Welch p {p_phrase(row['p_holm'])} after Holm's correction"
    test = f"Welch p {p_phrase(row['p_holm'])} after Holm's correction" if math.isfinite(row["p_holm"]) else "no test possible"
    return f"the intervals do not overlap; {test}"
