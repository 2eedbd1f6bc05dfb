"""How fast an arm learned, as rows of the final-metrics table: the area under its val/accuracy
curve (the mean accuracy over a range of steps every run covers) and the optimizer steps and
generated tokens it took to reach a threshold of accuracy halfway from the baseline's start to the
baseline's final value; and a run's accuracy at a budget of steps, generated tokens or training
FLOPs, for comparisons at matched compute.

Each row is a computed metric key that carries its parameters, so ``arms.final_value`` stays a
function of one run: ``auc@0-400:val/accuracy`` (steps 0 to 400), ``steps_to@0.3312:val/accuracy``,
``tokens_to@0.3312:val/accuracy`` and ``at_tokens@71100:val/accuracy``. A run that never reached
the threshold has ``inf``: it is shown as not reached, never left out of a mean. A run that did not
reach a budget has ``nan`` (no value: its curve is never extrapolated), and
:func:`budget_reason` says why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from grpo_lightning.report.metrics import Metric
from grpo_lightning.report.render.document import user_text
from grpo_lightning.report.render.formatting import fmt
from grpo_lightning.ablation.runs import FLOPS_TAG, TOKENS_TAG, Run

if TYPE_CHECKING:
    from grpo_lightning.report.arms import Arm

#: The validation metric whose curve is summarised.
CURVE_TAG = "val/accuracy"
AUC = "auc"
#: Computed keys of reaching the threshold, and the x axis each is measured on.
REACH_AXES = {"steps_to": "step", "tokens_to": "tokens"}  # formatting.REACH_PREFIXES
#: Computed keys of a curve's value at a budget, and the x axis the budget is on.
BUDGET_AXES = {"at_step": "step", "at_tokens": "tokens", "at_flops": "flops"}
#: The running totals behind the budget axes other than steps: a run that never logged one has no budget on it.
BUDGET_COUNTERS = {"tokens": TOKENS_TAG, "flops": FLOPS_TAG}
#: What a budget counts, by axis.
BUDGET_NOUNS = {"step": "optimizer steps", "tokens": "generated tokens", "flops": "training FLOPs"}


def area_under_curve(x: Sequence[float], y: Sequence[float], low: float, high: float) -> float:
    """The trapezoid area under the piecewise-linear curve ``(x, y)`` from ``low`` to ``high``,
    divided by ``high - low``: the mean of the curve over that range. The curve is interpolated
    at both ends; ``nan`` when it does not cover ``[low, high]``."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if not len(x) or not high > low or x[0] > low or x[-1] < high:
        return math.nan
    inside = (x > low) & (x < high)
    xs = np.concatenate([[low], x[inside], [high]])
    ys = np.concatenate([[np.interp(low, x, y)], y[inside], [np.interp(high, x, y)]])
    return float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2.0) / (high - low))


def first_crossing(x: Sequence[float], y: Sequence[float], threshold: float) -> float:
    """The first ``x`` at which the piecewise-linear curve ``(x, y)`` reaches ``threshold``
    (``x0 + (threshold - y0) / (y1 - y0) * (x1 - x0)`` between the last point below it and the
    first at or above it); ``inf`` when it never does, ``nan`` without points."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if not len(x):
        return math.nan
    reached = np.flatnonzero(y >= threshold)
    if not len(reached):
        return math.inf
    i = int(reached[0])
    if i == 0:
        return float(x[0])
    x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]
    return float(x0 + (threshold - y0) / (y1 - y0) * (x1 - x0))


def split_key(key: str) -> tuple[str, str, str]:
    """``auc@0-400:val/accuracy`` -> ``("auc", "0-400", "val/accuracy")``."""
    head, _, tag = key.rpartition(":")
    kind, _, parameter = head.partition("@")
    return kind, parameter, tag


def is_curve_key(key: str) -> bool:
    return split_key(key)[0] in (AUC, *REACH_AXES, *BUDGET_AXES)


def curve_value(run: Run, key: str) -> float:
    """A run's value of a key of :func:`curve_metrics`."""
    kind, parameter, tag = split_key(key)
    if kind == AUC:
        low, _, high = parameter.partition("-")
        return area_under_curve(*run.axis(tag, "step"), float(low), float(high))
    if kind in BUDGET_AXES:
        return value_at(*run.axis(tag, BUDGET_AXES[kind]), float(parameter))
    return first_crossing(*run.axis(tag, REACH_AXES[kind]), float(parameter))


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def curve_metrics(arms: Sequence[Arm], baseline: Arm | None) -> list[Metric]:
    """The area under the val/accuracy curve over the steps every run covers, and, when the
    baseline improved, the steps and tokens to reach halfway from its mean start to its mean
    final val/accuracy (rounded to four digits). None without validations."""
    curves = [run.axis(CURVE_TAG, "step") for arm in arms for run in arm.runs]
    if not curves or any(len(x) < 2 for x, _ in curves):
        return []
    low, high = max(float(x[0]) for x, _ in curves), min(float(x[-1]) for x, _ in curves)
    metrics = []
    if high > low:
        metrics.append(Metric(f"{AUC}@{_number(low)}-{_number(high)}:{CURVE_TAG}",
                              f"{CURVE_TAG} AUC (its mean over steps {_number(low)}-{_number(high)})", 1))  # fmt: skip
    if baseline is None:
        return metrics
    start = [run.initial[CURVE_TAG] for run in baseline.runs if CURVE_TAG in run.initial]
    final = baseline.finals(CURVE_TAG)
    if not start or not final or not float(np.mean(final)) > float(np.mean(start)):
        return metrics
    threshold = float(f"{(float(np.mean(start)) + float(np.mean(final))) / 2:.4g}")
    for kind, noun in (("steps_to", "optimizer steps"), ("tokens_to", "generated tokens")):
        metrics.append(Metric(f"{kind}@{threshold!r}:{CURVE_TAG}", f"{noun} to {CURVE_TAG} ≥ {threshold:g}", -1))
    return metrics


def threshold_note(metrics: Sequence[Metric], baseline: Arm | None) -> str:
    """What the table's curve rows are, in one paragraph (empty without them)."""
    parts = []
    for metric in metrics:
        kind, parameter, _ = split_key(metric.key)
        if kind == AUC:
            low, _, high = parameter.partition("-")
            parts.append(f"{CURVE_TAG} AUC: the area under each run's {CURVE_TAG} curve (linear between validations, "
                         f"the validation before training at step 0) from step {low} to step {high}, the range every "
                         "run covers, divided by its width: the run's mean accuracy over training.")  # fmt: skip
        elif kind == "steps_to" and baseline is not None:
            parts.append(f"The threshold {float(parameter):g} is halfway from **{user_text(baseline.name)}**'s mean {CURVE_TAG} "
                         "before training to its mean final value; each run's step (and generated tokens) at which "
                         "its curve first reaches it, linear between validations; “not reached by every seed” "
                         "where some seed never did (Final values of every run says which).")  # fmt: skip
    return " ".join(parts)


def reached_by_every_run(arm: Arm, key: str) -> bool:
    """Whether every run of ``arm`` reached the threshold of a ``steps_to``/``tokens_to`` key."""
    return not any(curve_value(run, key) == math.inf for run in arm.runs)


def value_at(x: Sequence[float], y: Sequence[float], budget: float) -> float:
    """The piecewise-linear curve ``(x, y)`` at ``x = budget``: ``y0 + (budget - x0) / (x1 - x0) *
    (y1 - y0)`` between the points either side of it (the last value logged at an x where several
    were); ``nan`` outside ``[x[0], x[-1]]``: a curve is never extrapolated."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    keep = np.append(x[1:] != x[:-1], True)
    x, y = x[keep], y[keep]
    if not len(x) or not x[0] <= budget <= x[-1]:
        return math.nan
    return float(np.interp(budget, x, y))


def budget_key(axis: str, budget: float, tag: str = CURVE_TAG) -> str:
    """``at_tokens@71100:val/accuracy``: ``tag`` at ``budget`` on ``axis`` (of ``BUDGET_AXES``)."""
    kind = next(k for k, a in BUDGET_AXES.items() if a == axis)
    return f"{kind}@{_number(budget)}:{tag}"


def recorded(run: Run, axis: str) -> bool:
    """Whether ``run`` logged the running total behind ``axis`` (steps always are)."""
    return axis not in BUDGET_COUNTERS or BUDGET_COUNTERS[axis] in run.scalars


def last_validation(run: Run, axis: str, tag: str = CURVE_TAG) -> float:
    """How far along ``axis`` the run's last validation of ``tag`` was (``nan`` without one)."""
    x, _ = run.axis(tag, axis)
    return float(x.max()) if len(x) else math.nan


def budget_reason(run: Run, key: str) -> str:
    """Why ``run`` has no value of a budget key: it did not record the axis, did not validate, or
    its validations do not bracket the budget."""
    kind, parameter, tag = split_key(key)
    axis, budget = BUDGET_AXES[kind], float(parameter)
    if not recorded(run, axis):
        return f"did not record {BUDGET_COUNTERS[axis]}"
    x, _ = run.axis(tag, axis)
    if not len(x):
        return f"did not log {tag}"
    if budget < x.min():
        return f"first validated after {fmt_budget(budget)} {BUDGET_NOUNS[axis]}"
    return f"ended at {fmt_budget(float(x.max()))} {BUDGET_NOUNS[axis]}, short of {fmt_budget(budget)}"


def round_budget(value: float) -> float:
    """``value`` rounded down to three significant digits (whole numbers below 1,000): a budget a
    reader can quote, still reached by every run that reached ``value``."""
    digits = max(len(str(int(value))) - 3, 0)
    return float(int(value) // 10**digits * 10**digits)


def common_budget(arms: Sequence[Arm], axis: str) -> float:
    """The largest budget on ``axis`` that every run recording it reached (its last validation at or
    beyond it), rounded down by :func:`round_budget`: no seed is lost to the budget itself. ``nan``
    when no run recorded the axis or validated."""
    ends = [last_validation(run, axis) for arm in arms for run in arm.runs if recorded(run, axis)]
    ends = [end for end in ends if math.isfinite(end)]
    if not ends or min(ends) <= 0:
        return math.nan
    return round_budget(min(ends))


def fmt_budget(value: float) -> str:
    """``71,100``; ``3.08e+11`` from a billion on (FLOPs)."""
    return f"{value:.4g}" if abs(value) >= 1e9 else fmt(value)
