"""The summary paragraph: each arm against the baseline on the metrics of ``SUMMARY_METRICS``, in
the words the paired tests allow ("better", "worse", "equivalent (±...)", "undetermined (MDE ...)"), with the
generated tokens each arm spent beside its effect, and the flags a reader must see first."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from grpo_lightning.report.arms import SMOOTHING_STEPS, UNFINISHED, Arm, diverged, seed_order
from grpo_lightning.report.sections.comparisons import (
    EQUIVALENCE_MARGIN,
    MIN_PAIRED_SEEDS,
    Effect,
    baseline_effects,
    comparable_arms,
    difference_text,
    different_starts,
    identical_arms,
)
from grpo_lightning.report.render.document import user_text
from grpo_lightning.report.render.formatting import UNITS, fmt, fmt_metric, p_phrase
from grpo_lightning.report.metrics import FINAL_METRICS, SUMMARY_METRICS, WALL_CLOCK_METRICS
from grpo_lightning.report.sections.seeds import far_seed_sentences

#: The metric whose cost is named beside each effect.
COST_KEY = "perf/generated_tokens"


def summary_paragraph(arms: Sequence[Arm], baseline: Arm | None = None, confidence: float = 0.95,
                      wall_clock_caveat: str | None = None,
                      configs: Mapping[str, Mapping[str, str]] | None = None, margin: float = EQUIVALENCE_MARGIN) -> str:  # fmt: skip
    """One sentence per metric of ``SUMMARY_METRICS``; ``wall_clock_caveat`` (why wall-clock
    times mean little on this machine) replaces the comparison of wall-clock metrics; ``margin``:
    the equivalence margin (see ``comparisons.equivalence_margin``)."""
    if not arms:
        return "No finished runs."
    baseline = baseline or arms[0]
    seeds = sorted({len(a.runs) for a in arms})
    parts = [f"{len(arms)} arm{'s' if len(arms) != 1 else ''} with {'/'.join(map(str, seeds))} seed(s) each."]
    parts += [sentence for sentence in [excluded_seeds_sentence(arms)] if sentence]
    if len(arms) < 2:
        return " ".join(parts) + " With a single arm there is no comparison."
    parts.append(f"Each arm is compared with the baseline **{user_text(baseline.name)}** over the seeds both ran (paired t-test, "
                 "Holm's correction over the arms; paired by prompt too where the runs wrote per-prompt outcomes, said "
                 "as seeds x prompts; see Effects against the baseline).")  # fmt: skip
    for key, label, direction in SUMMARY_METRICS:
        if key in WALL_CLOCK_METRICS and wall_clock_caveat:
            parts.append(f"The {label} is not compared: {wall_clock_caveat}")
            continue
        compared = comparable_arms(arms, baseline, key, configs or {})
        left_out = [a.name for a in arms if a not in compared]
        sentence = metric_sentence(compared, baseline, key, label, direction, confidence, margin) if len(compared) > 1 else ""
        if left_out:
            sentence += (f" The {label} of {', '.join(f'**{user_text(n)}**' for n in left_out)} is not compared with "
                         f"**{user_text(baseline.name)}**'s: other reward functions, so another scale.")  # fmt: skip
        if sentence:
            parts.append(sentence.strip())
    parts += flag_sentences(arms, baseline)
    initial = [v for a in arms for v in a.finals("initial:val/accuracy")]
    if initial:
        parts.append(f"Before training, val/accuracy was {fmt_metric(float(np.mean(initial)))} on average.")
    return " ".join(parts)


def metric_sentence(arms: Sequence[Arm], baseline: Arm, key: str, label: str, direction: int, confidence: float,
                    margin: float = EQUIVALENCE_MARGIN) -> str:  # fmt: skip
    """``On final val/accuracy (grpo 0.24): **dapo** better (+0.05 [0.01, 0.09], p = 0.01, 2x the tokens); ...``"""
    effects = baseline_effects(arms, baseline, key, direction, confidence, label, margin)
    if not effects or not baseline.finals(key):
        return ""
    unit = UNITS.get(key, "")
    base = fmt_metric(baseline.interval(key, confidence)[0], key) + unit
    smoothing = f", mean of the last {SMOOTHING_STEPS} steps" if key == "reward" else ""
    described = "; ".join(effect_phrase(e, arms, baseline, key) for e in effects)
    return f"On {label} ({user_text(baseline.name)} {base}{smoothing}): {described}."


def effect_phrase(effect: Effect, arms: Sequence[Arm], baseline: Arm, key: str) -> str:
    """``**dapo** +0.07 [0.04, 0.11], better (Holm p = 0.0163); 1.99x the tokens``; ``**rloo** +0.003
    [-0.008, 0.014], equivalent (±0.02) (TOST, Holm p = 0.0021)``; ``**dapo** (4 pairs of 5 seeds) ...``
    where some seed is no pair."""
    pairs = (f"({effect.n} pair{'s' if effect.n != 1 else ''} of {effect.pairs.total} seeds) "
             if effect.pairs and effect.pairs.excluded else "")  # fmt: skip
    # the difference is in the verdict's own words where there is no test, unless too few seeds stopped it
    shown = math.isfinite(effect.p) or (effect.n < MIN_PAIRED_SEEDS and math.isfinite(effect.mean))
    method = f" (seeds x {effect.two_level.components.prompts} prompts)" if effect.two_level and shown else ""
    text = f"**{user_text(effect.arm)}** " + pairs + (f"{difference_text(effect)}{method}, " if shown else "") + effect.verdict
    if effect.verdict in ("better", "worse", "higher", "lower") or effect.verdict.startswith("below"):
        text += f" (Holm p {p_phrase(effect.p_holm)})"
    elif effect.verdict.startswith("equivalent"):
        text += f" (TOST, Holm p {p_phrase(effect.p_equivalence_holm)})"
    cost = cost_text(next(a for a in arms if a.name == effect.arm), baseline) if key != COST_KEY else ""
    return text + (f"; {cost}" if cost else "")


def excluded_seeds_sentence(arms: Sequence[Arm]) -> str:
    """``Seeds left out: **grpo** seed 3 diverged (final reward, kl non-finite).``: each seed that some
    final number of its arm was computed without, and why; empty when every number has every seed."""
    described = [f"**{user_text(arm.name)}** seed {seed} {why}" for arm in arms for seed, why in lost_seeds(arm).items()]
    if not described:
        return ""
    return ("Seeds left out: " + "; ".join(described) + ". Each mean and each comparison uses the seeds that have "
            "its value, and says how many (n of the arm's seeds; pairs of the seeds either arm ran).")  # fmt: skip


def lost_seeds(arm: Arm) -> dict[Any, str]:
    """Each seed of ``arm`` missing from one of its final metrics, and why: unfinished (in none of
    them), diverged (the metrics that ended non-finite), or the metrics it did not log."""
    unfinished = {cell.seed for cell in arm.unfinished}
    lost = {seed: f"{UNFINISHED}: in none of its numbers" for seed in unfinished}
    nonfinite: dict[Any, list[str]] = {}
    unlogged: dict[Any, list[str]] = {}
    for metric in FINAL_METRICS:
        count = arm.partial_count(metric.key, metric.label)
        for seed, why in count.excluded if count else ():
            if seed not in unfinished:
                (nonfinite if diverged(why) else unlogged).setdefault(seed, []).append(metric.label)
    for seed in set(nonfinite) | set(unlogged):
        reasons = [f"diverged (final {', '.join(nonfinite[seed])} non-finite)"] if seed in nonfinite else []
        reasons += [f"did not log {', '.join(unlogged[seed])}"] if seed in unlogged else []
        lost[seed] = " and ".join(reasons)
    return dict(sorted(lost.items(), key=lambda item: seed_order(item[0])))


def cost_text(arm: Arm, baseline: Arm) -> str:
    """``1.98x the tokens``: the arm's mean generated tokens over the baseline's."""
    mine, theirs = arm.finals(COST_KEY), baseline.finals(COST_KEY)
    if not mine or not theirs or float(np.mean(theirs)) <= 0:
        return ""
    return f"{fmt(float(np.mean(mine)) / float(np.mean(theirs)), 3)}x the tokens"


def flag_sentences(arms: Sequence[Arm], baseline: Arm) -> list[str]:
    """Seeds far from their arm's others, arms identical to another at every seed, arms that started
    from another point, and final validations taken at different training steps."""
    sentences = far_seed_sentences(arms)
    steps = {a.name: sorted(set(a.finals("step_of:val/accuracy"))) for a in arms}
    if len({tuple(s) for s in steps.values() if s}) > 1:
        shown = "; ".join(f"**{user_text(name)}** {', '.join(fmt_metric(v) for v in s)}" for name, s in steps.items() if s)
        sentences.append(f"**Warning:** the final val/accuracy was taken at different training steps ({shown}): "
                         "arms validated at an earlier step had less training when compared.")  # fmt: skip
    for a, b in identical_arms(arms):
        sentences.append(f"**Warning:** **{user_text(a)}** and **{user_text(b)}** logged the same reward, kl and val/accuracy at every "
                         "step of every seed: what sets them apart had no effect.")  # fmt: skip
    for name, mine, theirs in different_starts(arms, baseline):
        sentences.append(f"**Warning:** **{user_text(name)}** started from val/accuracy {fmt(mine)} before training against "
                         f"{fmt(theirs)} for **{user_text(baseline.name)}** at the same seeds: its differences include its start.")  # fmt: skip
    return sentences
