"""The Final metrics section: each arm's final metrics with Student-t intervals over seeds, each
run's final values (its accuracy with an interval over the validation prompts), and the same
table as ``final_metrics.csv`` and ``final_metrics.tex`` beside the report."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from grpo_lightning.evaluation.intervals import proportion_interval
from grpo_lightning.evaluation.outcomes import PromptOutcomes
from grpo_lightning.report.arms import SMOOTHING_STEPS, WIDE, Arm, final_value, ranked
from grpo_lightning.report.render.document import Doc, user_text
from grpo_lightning.report.render.formatting import fmt_interval, fmt_metric
from grpo_lightning.report.learning import REACH_AXES, reached_by_every_run, split_key
from grpo_lightning.report.metrics import FINAL_METRICS, PER_RUN_METRICS, WALL_CLOCK_METRICS, Metric
from grpo_lightning.ablation.runs import Run
from grpo_lightning.report.statistics import wilson_interval
from grpo_lightning.report.render.tables import CSV_FILE, LATEX_FILE, Row, write_final_tables

INTERVAL = "Student t over seeds"


def final_rows(arms: Sequence[Arm], confidence: float, curve_metrics: Sequence[Metric] = ()) -> list[Row]:
    """``(metric, [(mean, low, high) per arm])`` of every metric some arm logged; ``curve_metrics``
    (``learning.curve_metrics``) follow the gain of val/accuracy. An arm with a seed that never
    reached a threshold has ``(inf, nan, nan)`` there: a mean over the seeds that did would flatter it."""
    rows = []
    for metric in table_metrics(curve_metrics):
        stats = [_stat(arm, metric.key, confidence) for arm in arms]
        if all(math.isnan(s[0]) for s in stats):
            continue
        rows.append((metric, stats))
    return rows


def table_metrics(curve_metrics: Sequence[Metric] = ()) -> list[Metric]:
    """``FINAL_METRICS`` with ``curve_metrics`` after the gain of val/accuracy."""
    at = next(i for i, m in enumerate(FINAL_METRICS) if m.key == "gain:val/accuracy") + 1
    return [*FINAL_METRICS[:at], *curve_metrics, *FINAL_METRICS[at:]]


def _stat(arm: Arm, key: str, confidence: float) -> tuple[float, float, float]:
    if split_key(key)[0] in REACH_AXES and arm.runs and not reached_by_every_run(arm, key):
        return (math.inf, math.nan, math.nan)
    return arm.interval(key, confidence)


def final_section(doc: Doc, arms: Sequence[Arm], confidence: float, target: Path, name: str,
                  wall_clock_caveat: str | None = None, curve_metrics: Sequence[Metric] = (),
                  curve_note: str = "") -> None:  # fmt: skip
    doc.h(2, "Final metrics")
    doc.p(
        f"Each run's value at the end of training: the last validation for val/*, the mean of the last "
        f"{SMOOTHING_STEPS} optimizer steps for training metrics (reward, kl, entropy, lengths, clip and "
        f"zero-spread shares). Mean over seeds [{confidence:.0%} Student-t interval over seeds, clipped to the "
        "range the quantity can take] (n = runs); one seed has no interval. These intervals describe each arm "
        "alone: whether two arms differ is the paired test of Effects against the baseline, not whether "
        f"their intervals overlap. Also as [{CSV_FILE}]({CSV_FILE}) and [{LATEX_FILE}]({LATEX_FILE}) (LaTeX, booktabs)."
    )
    if curve_note:
        doc.p(curve_note)
    rows = final_rows(arms, confidence, curve_metrics)
    labels = [_label(metric.key, metric.label, wall_clock_caveat) for metric, _ in rows]
    cells = [[interval_text(stat, metric.key) + count_note(arm, metric.key, metric.label) for arm, stat in zip(arms, stats)]
             for metric, stats in rows]  # fmt: skip
    names = [f"{user_text(a.name)} ({a.seed_count()})" for a in arms]
    if len(arms) > WIDE:  # one row per arm, best final val/accuracy first
        doc.p("Arms are sorted by their mean final val/accuracy (an order for reading; see Effects for tests).")
        doc.table(["#", "arm", *labels], [[str(r + 1), names[i], *(c[i] for c in cells)] for r, i in enumerate(ranked(arms))],
                  "rl" + "r" * len(labels))  # fmt: skip
    else:
        doc.table(["metric", *names], [[label, *row] for label, row in zip(labels, cells)])
    if wall_clock_caveat and any(metric.key in WALL_CLOCK_METRICS for metric, _ in rows):
        doc.p(f"† Training wall-clock: {wall_clock_caveat}")
    caption = (
        f"Final metrics of {name}: mean over seeds [{confidence:.0%} Student-t interval over seeds]; training "
        f"metrics averaged over the last {SMOOTHING_STEPS} steps."
    )
    counts = [[_used(a, metric.key, metric.label) for a in arms] for metric, _ in rows]
    write_final_tables(target, name, [a.name for a in arms], [len(a.runs) for a in arms], counts, rows, INTERVAL, caption)
    per_run_section(doc, arms, confidence, curve_metrics, wall_clock_caveat)


def count_note(arm: Arm, key: str, label: str) -> str:
    """`` (n=4 of 5; seed 3 diverged (final reward non-finite))`` after a number that fewer seeds
    give than the arm's column says; empty otherwise."""
    count = arm.partial_count(key, label)
    return f" ({count})" if count else ""


def _used(arm: Arm, key: str, label: str) -> int:
    """The seeds behind the arm's number of ``key`` in the CSV and LaTeX tables."""
    count = arm.partial_count(key, label)
    return count.used if count else len(arm.runs)


def _label(key: str, label: str, caveat: str | None) -> str:
    return label + " †" if caveat and key in WALL_CLOCK_METRICS else label


def interval_text(stat: tuple[float, float, float], key: str) -> str:
    """``mean [low, high]``; the mean alone for one seed; ``(all seeds equal)`` for a zero-width interval."""
    mean, low, high = stat
    if math.isfinite(low) and low == high == mean:
        return f"{fmt_metric(mean, key)} (all seeds equal)"
    return fmt_interval(mean, low, high, key)


def per_run_section(doc: Doc, arms: Sequence[Arm], confidence: float, curve_metrics: Sequence[Metric] = (),
                    wall_clock_caveat: str | None = None) -> None:  # fmt: skip
    keys = [(m.key, _label(m.key, m.label, wall_clock_caveat)) for m in table_metrics(curve_metrics)
            if m.key in PER_RUN_METRICS or m in curve_metrics]  # fmt: skip
    body = Doc()
    body.p(
        f"val/accuracy [{confidence:.0%} interval over the validation prompts]: from the per-prompt outcomes of "
        "that validation where the run wrote them (the exact binomial interval at the effective number of "
        "completions, as validation logs it), else the interval the run logged (`val/accuracy_ci_low`, `_ci_high`), "
        "else the Wilson score interval of the number of right answers among the validation prompts of its "
        "config (one greedy answer each)."
    )
    body.table(
        ["run", "seed", *(label for _, label in keys)],
        [[user_text(cell.name), str(cell.seed),
          *(_run_value(cell.config, run, k, confidence, arm.outcomes.get(cell.seed)) for k, _ in keys)]
         for arm in arms for cell, run in zip(arm.cells, arm.runs)],
        "ll" + "r" * len(keys),
    )  # fmt: skip
    doc.details("Final values of every run", body)


def _run_value(config: Mapping[str, Any], run: Run, key: str, confidence: float,
               outcomes: PromptOutcomes | None = None) -> str:  # fmt: skip
    """A run's final value of ``key``; val/accuracy with its interval over the validation prompts
    (:func:`run_accuracy_interval`)."""
    value = final_value(run, key)
    if key != "val/accuracy":
        return fmt_metric(value, key)
    return fmt_interval(value, *run_accuracy_interval(config, run, confidence, outcomes), key)


def run_accuracy_interval(config: Mapping[str, Any], run: Run, confidence: float,
                          outcomes: PromptOutcomes | None = None) -> tuple[float, float]:  # fmt: skip
    """The interval of a run's final val/accuracy over its validation prompts: from the per-prompt
    ``outcomes`` of that validation where the run wrote them (the exact binomial interval at the
    effective number of completions, :func:`~grpo_lightning.evaluation.intervals.proportion_interval`),
    else the interval the run logged, else the Wilson score interval of the prompts of its config."""
    value = final_value(run, "val/accuracy")
    if outcomes is not None and outcomes.correct.size:
        correct = np.asarray(outcomes.correct, dtype=np.float64)
        per_prompt = correct[~np.isnan(correct).any(axis=1)].mean(axis=1)
        if per_prompt.size and abs(float(per_prompt.mean()) - value) < 1e-6:  # that validation's outcomes
            return proportion_interval(per_prompt, outcomes.correct.shape[1], confidence)
    low, high = final_value(run, "val/accuracy_ci_low"), final_value(run, "val/accuracy_ci_high")
    prompts = validation_prompts(config)
    if not math.isfinite(low) and prompts and math.isfinite(value):
        low, high = wilson_interval(round(value * prompts), prompts, confidence)
    return low, high


def validation_prompts(config: Mapping[str, Any]) -> int | None:
    """The number of validation prompts of a run's config, when one greedy answer per prompt makes
    its accuracy a count of successes; None where it is not known."""
    data = _init_args(config, "data")
    model = _init_args(config, "model")
    trainer = config.get("trainer") or {}
    samples = (model.get("evaluation") or {}).get("samples", model.get("val_samples"))  # flat in runs before the groups
    if trainer.get("limit_val_batches") not in (None, 1.0) or (samples or 1) != 1:
        return None
    counts = [data[k] for k in ("num_val", "max_val_samples") if isinstance(data.get(k), int) and data[k] > 0]
    return min(counts) if counts else None


def _init_args(config: Mapping[str, Any], section: str) -> Mapping[str, Any]:
    part = config.get(section) or {}
    return (part.get("init_args") or {}) if isinstance(part, Mapping) else {}
