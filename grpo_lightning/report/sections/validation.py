"""The Evaluation section: the final validation accuracy, ``pass@k`` and ``maj@k`` of each arm
(mean over seeds with its interval over seeds), and each run's own interval over prompts
(``val/<metric>_ci_low`` / ``_ci_high``, a bootstrap over prompts logged by the run)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from grpo_lightning.report.arms import Arm, final_value
from grpo_lightning.report.render.document import Doc, user_text
from grpo_lightning.report.sections.finals import count_note, interval_text
from grpo_lightning.report.render.formatting import fmt_interval

_METRIC = re.compile(r"^val/(accuracy|pass@(\d+)|maj@(\d+)|mean_length)$")
CI_LOW, CI_HIGH = "_ci_low", "_ci_high"


def evaluation_tags(arms: Sequence[Arm]) -> list[str]:
    """The validation metrics logged by any run: accuracy, pass@k by k, maj@k by k, mean_length."""
    found = {tag for arm in arms for run in arm.runs for tag in run.scalars if _METRIC.match(tag)}
    return sorted(found, key=_order)


def _order(tag: str) -> tuple[int, int]:
    match = _METRIC.match(tag)
    name = match.group(1)
    kind = 0 if name == "accuracy" else 1 if match.group(2) else 2 if match.group(3) else 3
    return (kind, int(match.group(2) or match.group(3) or 0))


def has_sampled_evaluation(arms: Sequence[Arm]) -> bool:
    """Whether the runs logged more than the greedy accuracy: pass@k, maj@k or intervals over prompts."""
    return any(
        tag.startswith(("val/pass@", "val/maj@")) or tag.endswith(CI_LOW)
        for arm in arms for run in arm.runs for tag in run.scalars
    )  # fmt: skip


def run_interval_text(arm: Arm, index: int, tag: str) -> str:
    """A run's final value of ``tag`` with the interval over prompts it logged."""
    run = arm.runs[index]
    value, low, high = (final_value(run, t) for t in (tag, tag + CI_LOW, tag + CI_HIGH))
    return fmt_interval(value, low, high, tag)


def evaluation_section(doc: Doc, arms: Sequence[Arm], confidence: float) -> None:
    if not has_sampled_evaluation(arms):
        return
    tags = evaluation_tags(arms)
    doc.h(2, "Evaluation")
    doc.p(
        f"Final validation metrics: mean over seeds [{confidence:.0%} Student-t interval over seeds, clipped to "
        "[0, 1]]. pass@k: a prompt counts when any of k of its n samples is right; "
        "maj@n: when the answer most of its n samples give is right."
    )
    header = ["metric", *(f"{user_text(a.name)} ({a.seed_count()})" for a in arms)]
    rows = [[tag.removeprefix("val/"), *(interval_text(a.interval(tag, confidence), tag) + count_note(a, tag, tag) for a in arms)]
            for tag in tags]  # fmt: skip
    doc.table(header, rows)
    with_ci = [tag for tag in tags if any(tag + CI_LOW in run.scalars for a in arms for run in a.runs)]
    if not with_ci:
        return
    body = Doc()
    body.p("Each run's final value [the interval over prompts it logged itself: the sampling of prompts only, "
           "not of seeds].")  # fmt: skip
    body.table(
        ["run", *(tag.removeprefix("val/") for tag in with_ci)],
        [[user_text(cell.name), *(run_interval_text(arm, i, tag) for tag in with_ci)]
         for arm in arms for i, cell in enumerate(arm.cells)],
    )  # fmt: skip
    doc.details("Per run, with intervals over prompts", body)
