"""Each arm against the baseline on final greedy accuracy alone, over the cells of several sweep or
report ``data/`` folders: the prompt-paired comparison of a report's Comparisons section
(``report.sections.comparisons.baseline_effects``: the two-level analysis over seeds and prompts,
Holm over the arms, equivalence at a margin, the design's MDE and the seeds it needs), from what
every finished cell keeps of its final validation: ``metrics.json`` and the per-prompt outcomes.

    python benchmarks/final_accuracy.py reports/smollm2_variants/data@0-3 \\
        benchmarks/results/smollm2_variants_h200/seeds4_8_f700a47 > final_accuracy.md

A source ``DIR@SEEDS`` (``@0-3``, ``@0,2,5``) takes only those seeds' cells of ``DIR``: one card's seeds of a
folder that joined two.

For cells kept without their step-wise scalars (the report needs those for every other section).
Nothing here averages over steps: each cell's final val/accuracy is its last validation's, checked
against the mean of its outcomes, so a cell whose outcomes are not that validation's is refused.
Duplicate cells and cells of other settings are refused as the report refuses them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from grpo_lightning.ablation.runs import Run, Series
from grpo_lightning.report.arms import Arm
from grpo_lightning.report.build import arm_order, attach_outcomes, baseline_arm
from grpo_lightning.report.cells import check_one_design, discover_cells, refuse_duplicate_cells
from grpo_lightning.report.data import read_sweep_record
from grpo_lightning.report.outcomes import OUTCOME_METRIC, final_outcomes
from grpo_lightning.report.paired import interquartile_mean, mean_squares
from grpo_lightning.report.render.formatting import fmt, fmt_p
from grpo_lightning.report.sections.seeds import spread_sentence
from grpo_lightning.report.sections.comparisons import (
    EQUIVALENCE_MARGIN,
    TARGET_MDE,
    baseline_effects,
    difference_text,
    far_seeds,
    improvement_text,
    mde_text,
    pairs_text,
    seeds_needed_text,
)
from grpo_lightning.report.statistics import holm

KEY = OUTCOME_METRIC
#: Each cell's generated tokens over the whole fit (``metrics.json``), to set each arm's cost beside its accuracy.
TOKENS = "total:generated_tokens"


def final_only_run(directory: Path) -> Run:
    """A run holding the final ``val/accuracy`` of a cell's ``metrics.json`` at its step, and the
    accuracy before training; refused where the last outcomes are of another step or give another accuracy."""
    metrics = json.loads((directory / "metrics.json").read_text())
    value, step = metrics["final"].get(KEY), metrics["final_step"].get(KEY)
    if value is None or step is None:
        raise SystemExit(f"{directory}: metrics.json has no final {KEY}")
    outcomes = final_outcomes(directory)
    if outcomes is None or outcomes.step != step or abs(float(np.nanmean(outcomes.correct)) - value) > 1e-5:
        raise SystemExit(f"{directory}: its final outcomes do not give its final {KEY} ({value} at step {step})")
    initial = {KEY: metrics["val/accuracy_before"]} if "val/accuracy_before" in metrics else {}
    scalars = {KEY: Series(np.array([int(step)]), np.array([float(value)]), np.array([0.0]))}
    if "generated_tokens" in metrics:  # the fit's total, under a key of its own: no step-wise series is made up
        scalars[TOKENS] = Series(np.array([int(step)]), np.array([float(metrics["generated_tokens"])]), np.array([0.0]))
    return Run(directory, scalars, initial)


def source(text: str) -> tuple[Path, set[int] | None]:
    """``DIR`` or ``DIR@SEEDS``: the folder, and the seeds taken from it (``None``: all)."""
    folder, at, seeds = text.rpartition("@")
    if not at or Path(text).exists():
        return Path(text), None
    try:
        taken = set()
        for part in seeds.split(","):
            low, _, high = part.partition("-")
            taken |= set(range(int(low), int(high or low) + 1))
    except ValueError:
        raise SystemExit(f"{text}: the seeds after @ are a range (0-3) or a list (0,2,5)") from None
    return Path(folder), taken


def load(sources: list[Path | tuple[Path, set[int] | None]]) -> list[Arm]:
    pairs = [s if isinstance(s, tuple) else (s, None) for s in sources]
    cells = [cell for folder, seeds in pairs for cell in discover_cells(folder) if seeds is None or cell.seed in seeds]
    refuse_duplicate_cells(cells)
    check_one_design(cells)
    arms: dict[str, Arm] = {}
    for cell in cells:
        arm = arms.setdefault(cell.arm, Arm(cell.arm, [], []))
        if cell.finished:
            arm.cells.append(cell)
            arm.runs.append(final_only_run(cell.directory))
        else:
            arm.unfinished.append(cell)
    ranked = sorted(arms.values(), key=lambda a: arm_order(a.name, cells))  # the report's order
    unpaired = attach_outcomes(ranked)
    if unpaired:
        raise SystemExit(f"per-prompt outcomes cannot be paired: {unpaired}")
    return ranked


def recorded_baseline(folders: list[Path]) -> str | None:
    """The baseline the sources' ``sweep.json`` name (a joined report's), as the report reads it; refused where
    they name different ones."""
    named = sorted({str(b) for b in (read_sweep_record(f).get("baseline") for f in folders) if b is not None})
    if len(named) > 1:
        raise SystemExit(f"the sources' sweep.json name different baselines ({', '.join(named)}); choose one with --baseline")
    return named[0] if named else None


def code_line(arms: list[Arm]) -> str:
    """The commit each cell started from, with its seeds (``unrecorded``: cells older than the record)."""
    seeds: dict[str, set] = {}
    for cell in (c for arm in arms for c in arm.cells):
        commit = (cell.code or {}).get("commit")
        seeds.setdefault(commit[:7] if commit else "unrecorded", set()).add(cell.seed)
    return "; ".join(f"{commit}: seeds {', '.join(map(str, sorted(s)))}" for commit, s in sorted(seeds.items()))


def mean_tokens(arm: Arm) -> float:
    """The arm's mean generated tokens over its seeds (``nan`` where no cell recorded them)."""
    totals = arm.finals(TOKENS)
    return float(np.mean(totals)) if totals else math.nan


def rank_test(differences: list[float]) -> float:
    """Wilcoxon's signed-rank p of the seeds' paired differences (exact where scipy can), a check of the t
    analysis that assumes no normal spread of the seeds; ``nan`` below two nonzero differences."""
    from scipy import stats

    nonzero = [d for d in differences if d != 0]
    return float(stats.wilcoxon(nonzero).pvalue) if len(nonzero) >= 2 else math.nan


def seed_share(arms: list[Arm]) -> tuple[float, float, float, float, int, int] | None:
    """How much a seed shares across arms: the two-way analysis of variance (arm x seed, one value a cell)
    of the arms that ran every seed any arm ran (arms missing one are left out), as (seed variance
    component, residual variance, F, p, arms, seeds); ``None`` below 2 arms or 2 seeds, or without residual
    variance. A component near 0 says that pairing by seed reduces little variance."""
    from scipy import stats

    seeds = sorted({seed for arm in arms for seed in arm.finals_by_seed(KEY)})
    rows = [[arm.finals_by_seed(KEY)[s] for s in seeds] for arm in arms if set(arm.finals_by_seed(KEY)) >= set(seeds)]
    if len(rows) < 2 or len(seeds) < 2:
        return None
    a, n = len(rows), len(seeds)
    ms_seed, _, ms_residual = (float(ms) for ms in mean_squares(np.array(rows).T))  # seeds as rows, arms as columns
    if ms_residual < 1e-15:  # arms that differ by a constant at every seed: nothing to weigh a seed's share against
        return None
    f = ms_seed / ms_residual
    return max(0.0, (ms_seed - ms_residual) / a), ms_residual, f, float(stats.f.sf(f, n - 1, (a - 1) * (n - 1))), a, n


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="+", help="sweep folders or reports' data/ folders (DIR@0-3: those seeds' cells)")
    parser.add_argument("--baseline", default=None, help="the arm the others are compared with (default: the sweep's, as the report reads it)")
    parser.add_argument("--equivalence-margin", type=float, default=EQUIVALENCE_MARGIN)
    parser.add_argument("--target-mde", type=float, default=TARGET_MDE)
    parser.add_argument("--confidence", type=float, default=0.95)
    args = parser.parse_args(argv)

    sources = [source(text) for text in args.sources]
    arms = load(sources)
    chosen = args.baseline or recorded_baseline([folder for folder, _ in sources])
    baseline = baseline_arm(arms, [c for a in arms for c in a.cells], chosen)
    out = sys.stdout
    out.write(f"# Final greedy accuracy ({KEY}), {sum(len(a.cells) for a in arms)} finished cells\n\n")
    out.write(f"Sources: {', '.join(f'`{s}`' for s in args.sources)}. Code: {code_line(arms)}.\n\n")
    level = f"{args.confidence:.0%}"
    out.write(f"| arm | seeds | mean [{level} CI] | IQM | before | generated tokens (x baseline) | per seed |\n")
    out.write("|---|---|---|---|---|---|---|\n")
    base_tokens = mean_tokens(baseline)
    for arm in arms:
        mean, low, high = arm.interval(KEY, args.confidence)
        by_seed = arm.finals_by_seed(KEY)
        before = [r.initial.get(KEY, math.nan) for r in arm.runs]
        per_seed = ", ".join(f"{seed}: {fmt(v, 3)}" for seed, v in sorted(by_seed.items()))
        tokens = mean_tokens(arm)
        out.write(f"| {arm.name} | {arm.seed_count(KEY, KEY)} | {fmt(mean, 3)} [{fmt(low, 3)}, {fmt(high, 3)}] | "
                  f"{fmt(interquartile_mean(by_seed.values()), 3)} | {fmt(float(np.nanmean(before)), 3)} | "
                  f"{tokens:,.0f} ({fmt(tokens / base_tokens, 3)}x) | {per_seed} |\n")
    effects = baseline_effects(arms, baseline, KEY, +1, args.confidence, margin=args.equivalence_margin,
                               target_mde=args.target_mde)
    out.write(f"\nAgainst **{baseline.name}**, paired by seed, and by prompt where the pairs say seeds x prompts (Holm over "
              f"{len(effects)} arms; equivalence margin ±{fmt(args.equivalence_margin, 2)}):\n\n")
    out.write(f"| arm | pairs | difference [{level} CI] | p (Holm) | equivalence p (Holm) | MDE [{level} CI] | P(arm > base) "
              "| verdict | rank test p (Holm) |\n")
    out.write("|---|---|---|---|---|---|---|---|---|\n")
    ranks = holm([rank_test(e.differences) for e in effects])
    for e, rank in zip(effects, ranks):
        out.write(f"| {e.arm} | {pairs_text(e)} | {difference_text(e)} | {fmt_p(e.p_holm)} | {fmt_p(e.p_equivalence_holm)} | "
                  f"{mde_text(e)} | {improvement_text(e)} | {e.verdict} | {fmt_p(rank)} |\n")
    out.write("\nThe rank test (Wilcoxon's signed-rank over the seeds' paired differences, Holm over the same arms) checks the "
              "verdicts without assuming normally spread seeds; where it does not reject as the verdict does, the verdict "
              "leans on that assumption.\n")
    share = seed_share(arms)
    if share:
        component, residual, f, p, a, n = share
        out.write(f"\nWhat a seed shares across arms ({a} arms that ran all {n} seeds; arm x seed analysis of variance): a seed "
                  f"component of {fmt(component, 3)} against a residual variance of {fmt(residual, 3)} (F {f:.2f}, p {fmt_p(p)}), a "
                  f"correlation of {fmt(component / (component + residual), 2)} between two arms' values at one seed.\n")
    needed = seeds_needed_text(effects, args.confidence)
    if needed:
        out.write(f"\n{needed}\n")
    far = {arm.name: far_seeds(arm, KEY) for arm in arms}
    if any(far.values()):
        out.write("\nSeeds far from their arm's others (the intervals and verdicts that use them cover less than they say): "
                  + "; ".join(f"**{name}** " + ", ".join(f"seed {seed} ({fmt(v, 3)})" for seed, v in seeds.items())
                              for name, seeds in far.items() if seeds) + ".\n")
    for arm in arms:  # as the report's Seeds section says
        for sentence in spread_sentence(arm, KEY, far[arm.name]):
            out.write(f"\n{sentence}\n")


if __name__ == "__main__":
    main()
