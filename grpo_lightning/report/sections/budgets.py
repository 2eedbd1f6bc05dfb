"""The Effects at matched compute section: each arm's val/accuracy against the baseline's at a
common budget of optimizer steps, of generated tokens and of training FLOPs, paired by seed and
tested as in Effects against the baseline, with a figure of the accuracies at those budgets.

Arms that sample more per step (DAPO's dynamic sampling and longer completions spend two to three
times GRPO's tokens) are ahead at equal steps partly because they spent more; read at equal tokens
or FLOPs, each arm is compared where it had spent as much as the other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from grpo_lightning.report.arms import Arm
from grpo_lightning.report.learning import (
    BUDGET_COUNTERS,
    BUDGET_NOUNS,
    CURVE_TAG,
    budget_key,
    budget_reason,
    common_budget,
    fmt_budget,
    recorded,
    round_budget,
    value_at,
)
from grpo_lightning.report.render.document import Doc, user_text
from grpo_lightning.report.render.formatting import fmt, fmt_interval, fmt_p, join_words
from grpo_lightning.report.render.plots import arm_colors, plot_budget_points
from grpo_lightning.report.sections.comparisons import (
    EQUIVALENCE_MARGIN,
    MIN_PAIRED_SEEDS,
    Effect,
    baseline_effects,
    difference_text,
    pairs_text,
)

#: The x axes of the comparisons, in the order of their tables.
AXES = ("step", "tokens", "flops")
#: Budgets read besides the common one, as fractions of it (in a folded table and the figure).
FRACTIONS = (0.25, 0.5, 0.75)
FRACTION_NAMES = ("¼", "½", "¾")
FIGURE = "budgets_val_accuracy.png"


@dataclass
class Matched:
    """The arms against the baseline at ``budget`` on ``axis`` (``nan``: the baseline did not record
    the axis); ``left_out``: each arm not compared there, and why."""

    axis: str
    budget: float
    effects: list[Effect] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)

    @property
    def key(self) -> str:
        return budget_key(self.axis, self.budget)

    @property
    def label(self) -> str:
        return budget_label(self.axis, self.budget)


def fractions_of(budget: float) -> list[float]:
    """The budgets of ``FRACTIONS`` of ``budget``, each rounded down to three significant digits."""
    return [round_budget(budget * fraction) for fraction in FRACTIONS]


def before_first_validation(arms: Sequence[Arm], axis: str, budget: float) -> bool:
    """Whether every run with a value at ``budget`` on ``axis`` has it on the straight line from its
    validation before training (at 0) to its first validation after it: the start is the same model for
    every arm at a seed, so each paired difference there is the first validation's scaled by the budget's
    share of the way to it (on steps, exactly: the same d_z and p), no comparison of its own. False when no
    run has a value there."""
    found = False
    for arm in arms:
        for run in arm.runs:
            if not recorded(run, axis):
                continue
            x, y = run.axis(CURVE_TAG, axis)
            if not math.isfinite(value_at(x, y, budget)):
                continue
            later = x[x > 0]
            if not ((x == 0).any() and len(later) and budget < later.min()):
                return False
            found = True
    return found


def budget_label(axis: str, budget: float) -> str:
    """``71,100 generated tokens``."""
    return f"{fmt_budget(budget)} {BUDGET_NOUNS[axis]}"


def matched(arms: Sequence[Arm], baseline: Arm, axis: str, budget: float, confidence: float = 0.95,
            margin: float = EQUIVALENCE_MARGIN) -> Matched:  # fmt: skip
    """Every arm's val/accuracy at ``budget`` minus the baseline's, paired by seed (``baseline_effects``
    of the budget key: Holm's correction over the arms at this budget)."""
    result = Matched(axis, budget)
    if not math.isfinite(budget):
        return result
    label = f"{CURVE_TAG} at {result.label}"
    result.effects = baseline_effects(arms, baseline, result.key, 1, confidence, label, margin)
    compared = {e.arm for e in result.effects}
    for arm in arms:
        if arm.name != baseline.name and arm.name not in compared:
            reasons = sorted({budget_reason(run, result.key) for run in arm.runs}) or ["no finished run"]
            result.left_out.append((arm.name, "; ".join(reasons)))
    return result


def matched_budgets(arms: Sequence[Arm], baseline: Arm, confidence: float = 0.95,
                    margin: float = EQUIVALENCE_MARGIN) -> list[Matched]:  # fmt: skip
    """One :class:`Matched` per axis of ``AXES`` at its :func:`~grpo_lightning.report.learning.common_budget`;
    ``nan`` where the baseline recorded no run's total on that axis."""
    found = []
    for axis in AXES:
        budget = common_budget(arms, axis)
        if not any(recorded(run, axis) for run in baseline.runs):
            budget = math.nan
        found.append(matched(arms, baseline, axis, budget, confidence, margin))
    return found


def accuracy_text(arm: Arm, key: str, label: str, confidence: float) -> str:
    """The arm's mean val/accuracy at a budget [interval over seeds], with the seeds left out."""
    count = arm.seed_count(key, label)
    if not count.used:
        return "n/a"
    text = fmt_interval(*arm.interval(key, confidence), key)
    return text + (f" ({count})" if count.excluded else "")


def not_recorded_text(axis: str, arms: Sequence[Arm], baseline: Arm) -> str:
    """Why there is no budget on ``axis``: no run, or none of the baseline's, logged its running total."""
    counter, noun = BUDGET_COUNTERS[axis], BUDGET_NOUNS[axis]
    if not any(recorded(run, axis) for arm in arms for run in arm.runs):
        return f"{noun[0].upper()}{noun[1:]} are not recorded: no run logged `{counter}` (runs recorded before it was added)."
    return f"{noun[0].upper()}{noun[1:]} are not recorded by **{user_text(baseline.name)}**: its runs did not log `{counter}`."


def verdict_changes(results: Sequence[Matched]) -> str:
    """One sentence for the summary: the arms whose verdict at one budget differs from another's
    (better at equal steps, worse at equal tokens), or that none does; empty without budgets."""
    shown = [r for r in results if math.isfinite(r.budget) and r.effects]
    if len(shown) < 2:
        return ""
    changed = []
    for arm in dict.fromkeys(e.arm for r in shown for e in r.effects):
        verdicts = [(r, next((e.verdict for e in r.effects if e.arm == arm), "")) for r in shown]
        if len({v.split(" ")[0] for _, v in verdicts if v}) > 1:
            changed.append(f"**{user_text(arm)}** is " + ", ".join(f"{v} at {r.label}" for r, v in verdicts if v))
    labels = " and ".join(r.label for r in shown)
    if not changed:
        return f"At matched compute ({labels}) every arm keeps its verdict on {CURVE_TAG}; see Effects at matched compute."
    return f"At matched compute the verdicts on {CURVE_TAG} differ: " + "; ".join(changed) + " (see Effects at matched compute)."


def budget_section(doc: Doc, arms: Sequence[Arm], baseline: Arm, confidence: float, target: Path,
                   margin: float = EQUIVALENCE_MARGIN, results: Sequence[Matched] | None = None) -> None:  # fmt: skip
    """The section; ``results``: :func:`matched_budgets` of these arguments, when the caller has them."""
    doc.h(2, "Effects at matched compute")
    doc.p(
        f"Each arm's {CURVE_TAG} against **{user_text(baseline.name)}**'s at a common budget of optimizer steps, of "
        "generated tokens (`perf/generated_tokens`, sampled for training) and of training FLOPs (`perf/flops`: 2N "
        "FLOPs per token pass of sampling, log-probabilities and updates). A seed's accuracy at a budget is read off its "
        "validation curve, linear between validations (the validation before training at 0); a seed whose last "
        "validation fell short of a budget has no value there and is named beside the number, never "
        "extrapolated. The budget of each table is the largest every run reached, rounded down to three "
        "significant digits, so that every seed counts; on ¼, ½ and ¾ of it, too, except where that falls before "
        "every run's first validation after the start: there each seed's value is the straight line from the start "
        "(the same model for every arm) to its first validation, so its differences are those of the first "
        "validation scaled down (the same d_z and p), no comparison of its own. The differences are paired by "
        f"seed and judged as in Effects against the baseline: paired t-test, Holm's correction over the arms at "
        f"one budget, equivalence within ±{margin:g}, MDE at 80% power, no verdict below {MIN_PAIRED_SEEDS} pairs."
    )
    if len(arms) < 2:
        doc.p("Only one arm: nothing to compare.")
        return
    results = matched_budgets(arms, baseline, confidence, margin) if results is None else results
    _overview(doc, arms, baseline, results, confidence)
    for result in results:
        if math.isfinite(result.budget):
            _detail(doc, arms, baseline, result, confidence, margin)
    columns = [(r.axis, r.budget, _points(arms, r, confidence)) for r in results if math.isfinite(r.budget)]
    plot_budget_points(columns, [BUDGET_NOUNS[axis] for axis, _, _ in columns], target / FIGURE, confidence,
                       arm_colors([a.name for a in arms]))  # fmt: skip
    doc.p(f"{CURVE_TAG} at ¼, ½, ¾ and all of each budget: mean over the seeds that reached it with its "
          f"{confidence:.0%} t-interval; dashed: the budget of the tables.")  # fmt: skip
    doc.img(f"{CURVE_TAG} at matched budgets", FIGURE)


def _overview(doc: Doc, arms: Sequence[Arm], baseline: Arm, results: Sequence[Matched], confidence: float) -> None:
    header = ["arm", *(f"at {r.label}" if math.isfinite(r.budget) else BUDGET_NOUNS[r.axis] for r in results)]
    rows = [[f"**{user_text(baseline.name)}** ({CURVE_TAG})",
             *(accuracy_text(baseline, r.key, f"{CURVE_TAG} at {r.label}", confidence) if math.isfinite(r.budget) else "not recorded"
               for r in results)]]  # fmt: skip
    for arm in arms:
        if arm.name == baseline.name:
            continue
        cells = []
        for r in results:
            effect = next((e for e in r.effects if e.arm == arm.name), None)
            if not math.isfinite(r.budget):
                cells.append("not recorded")
            elif effect is None:
                cells.append("not compared")
            else:
                cells.append(f"{difference_text(effect)}: {effect.verdict}")
        rows.append([f"**{user_text(arm.name)}**", *cells])
    doc.p(f"The baseline's {CURVE_TAG} at each budget, and each arm's difference to it [{confidence:.0%} t-interval] "
          "with its verdict:")  # fmt: skip
    doc.table(header, rows, "l" + "r" * len(results))
    for r in results:
        if not math.isfinite(r.budget):
            doc.p(not_recorded_text(r.axis, arms, baseline))


def _detail(doc: Doc, arms: Sequence[Arm], baseline: Arm, result: Matched, confidence: float, margin: float) -> None:
    doc.h(3, f"At {result.label}")
    header = ["arm", "seeds", CURVE_TAG, "difference", "d_z", "p", "p (Holm)", "p TOST (Holm)", "MDE", "verdict"]
    doc.table(header, _rows(arms, baseline, result, confidence), "llrrrrrrrl")
    if result.left_out:
        doc.p("Not compared: " + "; ".join(f"**{user_text(name)}** ({user_text(why)})" for name, why in result.left_out) + ".")
    shown, interpolated = [], []
    for fraction, budget in zip(FRACTION_NAMES, fractions_of(result.budget)):
        (interpolated if before_first_validation(arms, result.axis, budget) else shown).append((fraction, budget))
    if interpolated:
        doc.p(f"Not compared at {join_words([budget_label(result.axis, b) for _, b in interpolated])} "
              f"({join_words([f for f, _ in interpolated])} of {result.label}): before every run's first validation after "
              "the start, each seed's value there is interpolated from the start, its differences the first "
              "validation's scaled down.")  # fmt: skip
    if not shown:
        return
    body = Doc()
    for _, budget in shown:
        point = matched(arms, baseline, result.axis, budget, confidence, margin)
        body.h(4, f"At {point.label}")
        body.table(header, _rows(arms, baseline, point, confidence), "llrrrrrrrl")
    doc.details(f"At {join_words([f for f, _ in shown])} of {result.label}", body)


def _rows(arms: Sequence[Arm], baseline: Arm, result: Matched, confidence: float) -> list[list[str]]:
    label = f"{CURVE_TAG} at {result.label}"
    by_arm = {a.name: a for a in arms}
    rows = [[f"**{user_text(baseline.name)}**", str(baseline.seed_count(result.key, label).used),
             accuracy_text(baseline, result.key, label, confidence), *["—"] * 7]]  # fmt: skip
    for e in result.effects:
        rows.append([f"**{user_text(e.arm)}**", pairs_text(e), accuracy_text(by_arm[e.arm], result.key, label, confidence),
                     difference_text(e), fmt(e.effect_size, 3), fmt_p(e.p), fmt_p(e.p_holm), fmt_p(e.p_equivalence_holm),
                     fmt(e.mde), e.verdict])  # fmt: skip
    return rows


def _points(arms: Sequence[Arm], result: Matched, confidence: float) -> dict[str, list[tuple[float, float, float, float]]]:
    """Per arm, ``(budget, mean, low, high)`` of val/accuracy at each fraction of the budget it has seeds at."""
    points: dict[str, list[tuple[float, float, float, float]]] = {}
    for arm in arms:
        for budget in (*fractions_of(result.budget), result.budget):
            mean, low, high = arm.interval(budget_key(result.axis, budget), confidence)
            if math.isfinite(mean):
                points.setdefault(arm.name, []).append((budget, mean, low, high))
    return points
