"""The Learning curves section: one PNG per curve (in groups of arms, each with the baseline, when
there are many), with a warning beside the wall-clock column when the machine's load makes it
meaningless."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from grpo_lightning.report.arms import WIDE, Arm, ranked
from grpo_lightning.report.render.document import Doc, user_text
from grpo_lightning.report.render.plots import AXES, arm_colors, plot_curves, y_range
from grpo_lightning.ablation.runs import FLOPS_TAG, TOKENS_TAG
from grpo_lightning.report.sections.validation import evaluation_tags

#: Learning curves: file stem, title, tags drawn (one row each).
CURVES = [
    ("val_accuracy", "val/accuracy", ["val/accuracy"]),
    ("reward", "reward", ["reward"]),
    ("kl", "kl", ["kl"]),
    ("entropy", "entropy", ["entropy"]),
    ("mean_length", "completions/mean_length", ["completions/mean_length"]),
    ("clip_ratio", "clip_ratio", ["clip_ratio/low", "clip_ratio/high"]),
    ("frac_reward_zero_std", "frac_reward_zero_std", ["frac_reward_zero_std"]),
]
#: The figure of pass@k and maj@k over training, after val/accuracy's.
SAMPLED = ("pass_maj", "pass@k and maj@k")
#: Arms per figure in a wide report.
CURVE_GROUP = 4


def sampled_tags(arms: Sequence[Arm]) -> list[str]:
    """The pass@k (k > 1) and maj@k tags the runs validated with: pass@1 is val/accuracy's curve."""
    return [tag for tag in evaluation_tags(arms) if tag.startswith(("val/pass@", "val/maj@")) and tag != "val/pass@1"]


def curve_figures(arms: Sequence[Arm]) -> list[tuple[str, str, list[str]]]:
    """``CURVES``, with pass@k and maj@k after val/accuracy when the runs logged them."""
    sampled = sampled_tags(arms)
    return [CURVES[0], *([(*SAMPLED, sampled)] if sampled else []), *CURVES[1:]]


def curves_section(doc: Doc, arms: Sequence[Arm], target: Path, wall_clock_caveat: str | None = None,
                   baseline: Arm | None = None, confidence: float = 0.95) -> None:  # fmt: skip
    doc.h(2, "Learning curves")
    doc.p(
        "Thin lines: each seed. Thick line: the mean over seeds where every seed has data (linear interpolation "
        f"between logged points); band: the {confidence:.0%} Student-t interval of that mean at each point (the "
        "interval of Final metrics, point by point; one seed has none). One colour per arm and one y-range per "
        "curve in every figure. Columns: against training steps, against completion tokens generated "
        f"(cumulative `{TOKENS_TAG}`), against training FLOPs (cumulative `{FLOPS_TAG}`) where the runs recorded them "
        "and, where the machine's load allows, against wall-clock seconds since training began "
        "(validation time included); Effects at matched compute reads val/accuracy at common budgets of them. "
        "Step 0 of val/accuracy (and of pass@k and maj@k, drawn when the runs validated with several samples "
        "per prompt) is the validation before training, when it was run."
    )
    if wall_clock_caveat:
        doc.p(f"**The wall-clock column is left out:** {wall_clock_caveat[0].upper()}{wall_clock_caveat[1:]} "
              "Compare the arms against steps or generated tokens.")  # fmt: skip
    groups = [list(arms)]
    if len(arms) > WIDE:
        order = [arms[i] for i in ranked(arms) if baseline is None or arms[i].name != baseline.name]
        size = CURVE_GROUP - (baseline is not None)
        groups = [([baseline] if baseline else []) + order[start : start + size] for start in range(0, len(order), size)]
        doc.p(f"With {len(arms)} arms the curves come in groups of {CURVE_GROUP}"
              + (f", each with the baseline **{user_text(baseline.name)}**" if baseline else "")
              + ", the others in the order of their mean final val/accuracy.")  # fmt: skip
    colors = arm_colors([a.name for a in arms])
    logged_flops = any(FLOPS_TAG in run.scalars for arm in arms for run in arm.runs)  # older runs did not
    unlogged = [run.directory.name for arm in arms for run in arm.runs if FLOPS_TAG not in run.scalars]
    if not logged_flops:
        doc.p(f"Training FLOPs are not recorded: no run logged `{FLOPS_TAG}` (runs recorded before it was added), so "
              "no figure has their column.")  # fmt: skip
    elif unlogged:
        doc.p(f"**The training-FLOPs column leaves out {len(unlogged)} run(s) that did not log `{FLOPS_TAG}`** "
              f"(recorded before it was added): {', '.join(map(user_text, sorted(unlogged)))}.")  # fmt: skip
    shown = [a for a in AXES if not (wall_clock_caveat and a[0] == "time") and (logged_flops or a[0] != "flops")]
    for stem, title, tags in curve_figures(arms):
        if not any(tag in run.scalars or tag in run.initial for arm in arms for run in arm.runs for tag in tags):
            continue
        doc.h(3, title)
        ylims = {tag: y_range(arms, tag) for tag in tags}
        for number, group in enumerate(groups, start=1):
            filename = f"curves_{stem}.png" if len(groups) == 1 else f"curves_{stem}_{number}.png"
            heading = title if len(groups) == 1 else f"{title}: {', '.join(a.name for a in group)}"
            plot_curves(group, tags, heading, target / filename, confidence, colors, ylims, shown)
            doc.img(user_text(heading), filename)
