"""Arms (the runs of one setting over seeds), their final metrics, and how arms compare."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from grpo_lightning.report.cells import CellInfo
from grpo_lightning.report.runs import Run
from grpo_lightning.report.statistics import holm, welch_dof, welch_test

#: Final metrics of the table: (key, label, direction) with direction +1 higher is better,
#: -1 lower is better, 0 no preference. Keys are scalar tags or the computed entries below.
FINAL_METRICS = [
    ("val/accuracy", "val/accuracy", 1),
    ("initial:val/accuracy", "val/accuracy before training", 0),
    ("gain:val/accuracy", "val/accuracy gain", 1),
    ("val/reward", "val/reward", 1),
    ("val/mean_length", "val/mean_length", 0),
    ("reward", "reward", 1),
    ("reward_std", "reward_std", 0),
    ("frac_reward_zero_std", "frac_reward_zero_std", 0),
    ("kl", "kl", 0),
    ("entropy", "entropy", 0),
    ("completions/mean_length", "completions/mean_length", 0),
    ("clip_ratio/low", "clip_ratio/low", 0),
    ("clip_ratio/high", "clip_ratio/high", 0),
    ("steps", "training steps", 0),
    ("batches", "rollout batches", 0),
    ("perf/generated_tokens", "generated tokens", -1),
    ("train_time_s", "training wall-clock (s)", -1),
]

#: Columns of the per-run table.
PER_RUN_METRICS = {"val/accuracy", "initial:val/accuracy", "reward", "kl", "steps", "perf/generated_tokens", "train_time_s"}

#: Metrics the summary paragraph names a winner for: (key, label, superlative, direction).
SUMMARY_METRICS = [
    ("val/accuracy", "final val/accuracy", "highest", 1),
    ("reward", "final training reward", "highest", 1),
    ("kl", "final KL to the reference", "lowest", -1),
    ("perf/generated_tokens", "generated tokens", "fewest", -1),
    ("train_time_s", "training wall-clock", "shortest", -1),
]
UNITS = {"train_time_s": " s"}


def fmt(value: float, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    return f"{value:.{digits}g}"


def fmt_p(p: float) -> str:
    if not math.isfinite(p):
        return "n/a"
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


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
        return float(len(run.update_steps)) if len(run.update_steps) else math.nan
    if key == "batches":
        return float(run.update_steps[-1] + 1) if len(run.update_steps) else math.nan
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


def best_index(means: Sequence[float], direction: int) -> int | None:
    if direction == 0:
        return None
    finite = [(m * direction, -i) for i, m in enumerate(means) if math.isfinite(m)]
    if len(finite) < 2:
        return None
    best = max(finite)
    if sum(1 for value, _ in finite if value == best[0]) > 1:
        return None  # a tie: nobody in bold
    return -best[1]


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


def summary_paragraph(arms: Sequence[Arm]) -> str:
    """Which arm won on which metric, and whether its lead over the runner-up is significant."""
    if not arms:
        return "No finished runs."
    seeds = sorted({len(a.runs) for a in arms})
    parts = [f"{len(arms)} arm{'s' if len(arms) != 1 else ''} with {'/'.join(map(str, seeds))} seed(s) each."]
    if len(arms) < 2:
        return parts[0] + " With a single arm there is no comparison."
    for key, label, superlative, direction in SUMMARY_METRICS:
        scored = [(float(np.mean(a.finals(key))), a) for a in arms if a.finals(key)]
        if len(scored) < 2:
            continue
        scored.sort(key=lambda s: -direction * s[0])  # stable: ties keep the table order
        (best, winner), (second, runner_up) = scored[0], scored[1]
        unit = UNITS.get(key, "")
        if best == second:
            tied = [a.name for value, a in scored if value == best]
            parts.append(f"{_join_names(tied)} tie on {label} ({fmt(best) + unit}).")
            continue
        t, p = welch_test(winner.finals(key), runner_up.finals(key))
        if not math.isfinite(p):
            reason = "too few seeds to test" if min(len(winner.runs), len(runner_up.runs)) < 2 else "no variance within the arms"
            verdict = f"the gap to **{runner_up.name}** ({fmt(second) + unit}) is not tested ({reason})"
        else:
            word = "significant" if p < 0.05 else "not significant"
            verdict = f"its lead over **{runner_up.name}** ({fmt(second) + unit}) is {word} (Welch p {_p_phrase(p)})"
        parts.append(f"**{winner.name}** has the {superlative} {label} ({fmt(best) + unit}); {verdict}.")
    initial = [v for a in arms for v in a.finals("initial:val/accuracy")]
    if initial:
        parts.append(f"Before training, val/accuracy was {fmt(float(np.mean(initial)))}.")
    return " ".join(parts)


def _join_names(names: Sequence[str]) -> str:
    bold = [f"**{n}**" for n in names]
    return bold[0] if len(bold) == 1 else ", ".join(bold[:-1]) + " and " + bold[-1]


def _p_phrase(p: float) -> str:
    return "< 0.0001" if p < 1e-4 else f"= {p:.4f}"
