"""The Seeds section: each arm's final val/accuracy seed by seed beside its mean (a figure with one
dot per seed, and a table with the median and the interquartile mean), a flag on any seed far
from its arm's others (a collapsed run), and one on an arm whose seeds as a whole are not spread as
normal ones (several collapsed runs, two clusters): under either no interval over seeds covers what it says."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from grpo_lightning.report.arms import Arm
from grpo_lightning.report.paired import (
    OUTLIER_ALPHA,
    OUTLIER_MIN_SEEDS,
    SPREAD_ALPHA,
    SPREAD_MIN_SEEDS,
    interquartile_mean,
    normal_spread_p,
)
from grpo_lightning.report.render.document import Doc, user_text
from grpo_lightning.report.render.formatting import fmt_metric, p_phrase
from grpo_lightning.report.render.plots import arm_colors, plot_finals
from grpo_lightning.report.sections.comparisons import far_seeds
from grpo_lightning.report.sections.finals import interval_text

#: The metric whose seeds are drawn and checked, and its figure.
SEEDS_KEY = "val/accuracy"
SEEDS_FIGURE = "final_val_accuracy.png"


def far_seed_sentences(arms: Sequence[Arm], key: str = SEEDS_KEY) -> list[str]:
    """``**Warning:** **dapo** seed 3 ended val/accuracy 0.02, far below its other seeds (0.31, ...):
    a collapsed run? ...`` for every seed far from its arm's others, with what it does to the intervals;
    for an arm with none, a warning where its seeds as a whole are not spread as normal ones."""
    sentences = []
    for arm in arms:
        far = far_seeds(arm, key)
        if not far:
            sentences += spread_sentence(arm, key, far)
            continue
        others = [v for s, v in arm.finals_by_seed(key).items() if s not in far]
        below = all(value < min(others) for value in far.values())
        named = ", ".join(f"seed {seed} ended {key} {fmt_metric(value, key)}" for seed, value in far.items())
        sentences.append(
            f"**Warning:** **{user_text(arm.name)}** {named}, far {'below' if below else 'from'} its other seeds "
            f"({', '.join(fmt_metric(v, key) for v in others)}){': a collapsed run?' if below else '.'} Its seeds are not "
            "spread around one value, and intervals and verdicts over them cover less than they say (see Seeds and Method)."
        )
    return sentences


def spread_sentence(arm: Arm, key: str = SEEDS_KEY, far: dict | None = None) -> list[str]:
    """``**Warning:** **gspo**'s seeds are not spread as normal ones ...`` where the arm has no far seed
    (``far``: its ``far_seeds``, computed where not given) and Shapiro and Wilk's test of its final ``key``
    over seeds rejects at ``SPREAD_ALPHA``, with its lowest and highest seeds; else nothing."""
    if far_seeds(arm, key) if far is None else far:  # a far seed has its own warning
        return []
    by_seed = arm.finals_by_seed(key)
    p = normal_spread_p(list(by_seed.values()))
    if not p < SPREAD_ALPHA:
        return []
    ranked = sorted(by_seed.items(), key=lambda item: item[1])
    ends = [", ".join(f"seed {seed}: {fmt_metric(v, key)}" for seed, v in part) for part in (ranked[:3], ranked[-3:][::-1])]
    return [f"**Warning:** **{user_text(arm.name)}**'s seeds are not spread as normal ones would be (Shapiro-Wilk p "
            f"{p_phrase(p)} over {len(ranked)} seeds; lowest {ends[0]}; highest {ends[1]}): several seeds far from the "
            "rest, which hide each other from the check of one seed, or two clusters of seeds. Intervals and verdicts over "
            "them cover less than they say (see Seeds and Method)."]  # fmt: skip


def seeds_section(doc: Doc, arms: Sequence[Arm], target: Path, confidence: float) -> None:
    if not any(arm.finals(SEEDS_KEY) for arm in arms):
        return
    doc.h(2, "Seeds")
    doc.p(
        f"Each arm's final {SEEDS_KEY}: every seed as a dot, the mean with its {confidence:.0%} Student-t interval over "
        "seeds (the black bar) and the median (the diamond); in the table beside the mean, the median and the "
        "interquartile mean (IQM: the mean after dropping a quarter of the seeds, rounded down, from each end), "
        "which a single collapsed seed moves less. A seed far from the others "
        f"(from {OUTLIER_MIN_SEEDS} seeds: beyond the Bonferroni {OUTLIER_ALPHA:g} bound of its studentized residual "
        "among the arm's seeds, see Method) is circled and named, and an arm without one whose seeds as a whole are "
        f"not spread as normal ones (from {SPREAD_MIN_SEEDS} seeds: Shapiro and Wilk's test at {SPREAD_ALPHA:g}) is named."
    )
    flagged = {arm.name: list(far_seeds(arm, SEEDS_KEY)) for arm in arms}
    plot_finals(arms, SEEDS_KEY, target / SEEDS_FIGURE, confidence, arm_colors([a.name for a in arms]), flagged)
    doc.img(f"final {SEEDS_KEY} by seed", SEEDS_FIGURE)
    rows = []
    for arm in arms:
        by_seed = arm.finals_by_seed(SEEDS_KEY)
        if not by_seed:
            continue
        values = sorted(by_seed.values())
        median = float(np.median(values))
        shown = ", ".join(f"{seed}: {fmt_metric(v, SEEDS_KEY)}" + (" (far)" if seed in flagged[arm.name] else "")
                          for seed, v in by_seed.items())  # fmt: skip
        mean = interval_text(arm.interval(SEEDS_KEY, confidence), SEEDS_KEY)
        rows.append([f"**{user_text(arm.name)}**", str(len(values)), mean, fmt_metric(median, SEEDS_KEY),
                     fmt_metric(interquartile_mean(values), SEEDS_KEY), shown])  # fmt: skip
    doc.table(["arm", "n", "mean [interval]", "median", "IQM", "seed: value"], rows, "lrrrrl")
    for sentence in far_seed_sentences(arms):
        doc.p(sentence)
