"""How fast an arm learned, as rows of the final-metrics table: the area under its val/accuracy
curve (the mean accuracy over a range of steps every run covers) and the optimizer steps and
generated tokens it took to reach a threshold of accuracy halfway from the baseline's start to the
baseline's final value.

Each row is a computed metric key that carries its parameters, so ``arms.final_value`` stays a
function of one run: ``auc@0-400:val/accuracy`` (steps 0 to 400), ``steps_to@0.3312:val/accuracy``
and ``tokens_to@0.3312:val/accuracy``. A run that never reached the threshold has ``inf``: it is
shown as not reached, never left out of a mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from grpo_lightning.report.metrics import Metric
from grpo_lightning.report.render.document import user_text
from grpo_lightning.report.runs import Run

if TYPE_CHECKING:
    from grpo_lightning.report.arms import Arm

#: The validation metric whose curve is summarised.
CURVE_TAG = "val/accuracy"
AUC = "auc"
#: Computed keys of reaching the threshold, and the x axis each is measured on.
REACH_AXES = {"steps_to": "step", "tokens_to": "tokens"}  # formatting.REACH_PREFIXES


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
    return split_key(key)[0] in (AUC, *REACH_AXES)


def curve_value(run: Run, key: str) -> float:
    """A run's value of a key of :func:`curve_metrics`."""
    kind, parameter, tag = split_key(key)
    if kind == AUC:
        low, _, high = parameter.partition("-")
        return area_under_curve(*run.axis(tag, "step"), float(low), float(high))
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
