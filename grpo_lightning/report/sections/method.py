"""The Method section: every formula behind the report's numbers, as the code computes it, and the
simulated coverage of its intervals (``COVERAGE``: figures of ``benchmarks/interval_coverage.py``,
checked against a rerun by ``tests/report/test_paired.py``)."""

from __future__ import annotations

from grpo_lightning.report.arms import SMOOTHING_STEPS
from grpo_lightning.report.paired import MAX_SEEDS, OUTLIER_ALPHA, OUTLIER_MIN_SEEDS, SPREAD_ALPHA, SPREAD_MIN_SEEDS
from grpo_lightning.report.render.document import Doc
from grpo_lightning.report.sections.comparisons import (
    ALPHA,
    MIN_PAIRED_SEEDS,
    PRACTICAL_ABSOLUTE,
    PRACTICAL_RELATIVE,
)

#: Coverage at nominal 95% of the intervals of ``arm - baseline``: (scenario, seeds) -> (two-level t,
#: seed t, two-level bootstrap), from ``python benchmarks/interval_coverage.py`` (``COVERAGE_SIMULATIONS``
#: sweeps each, ``COVERAGE_PROMPTS`` prompts).
COVERAGE_SIMULATIONS = 2000
COVERAGE_PROMPTS = 100
COVERAGE: dict[tuple[str, int], tuple[float, float, float]] = {
    ("normal, seeds dominate", 3): (0.954, 0.956, 0.793),
    ("normal, seeds dominate", 5): (0.951, 0.951, 0.864),
    ("normal, seeds dominate", 10): (0.954, 0.953, 0.916),
    ("normal, prompts dominate", 3): (0.94, 0.822, 0.864),
    ("normal, prompts dominate", 5): (0.954, 0.678, 0.8),
    ("normal, prompts dominate", 10): (0.957, 0.504, 0.696),
    ("skewed", 3): (0.954, 0.95, 0.895),
    ("skewed", 5): (0.957, 0.956, 0.927),
    ("skewed", 10): (0.954, 0.946, 0.95),
    ("collapse", 3): (0.863, 0.885, 0.785),
    ("collapse", 5): (0.849, 0.842, 0.805),
    ("collapse", 10): (0.925, 0.912, 0.899),
}
#: seeds -> (a single collapsed seed named, any seed named without collapse), from the same run.
DETECTION: dict[int, tuple[float, float]] = {4: (0.325, 0.054), 5: (0.622, 0.055), 10: (0.985, 0.053)}
#: seeds -> (two or more collapsed seeds: any named by the check for far seeds, the whole arm flagged where it names
#: none; the whole arm flagged without collapse), from ``several_collapse_detection`` of the same script.
SPREAD_DETECTION: dict[int, tuple[float, float, float]] = {8: (0.0, 0.802, 0.024), 10: (0.0, 0.929, 0.034),
                                                           14: (0.0, 0.991, 0.036)}


def method_section(doc: Doc, confidence: float, margin: float, target_mde: float) -> None:
    doc.h(2, "Method")
    q = (1 + confidence) / 2
    doc.items(
        [
            "Runs of one arm differ only in their seed; each finished run counts once (unfinished runs are left out).",
            (
                f"Final value: the last validation for val/*; for training metrics the mean of the rows logged in the "
                f"last {SMOOTHING_STEPS} optimizer steps (one row per step where a run logs each step; where it logs "
                "once per rollout of several steps, the rollouts ending in them); totals (tokens, steps, time) at the end."
            ),
            (
                f"Interval of a mean over n seeds: mean ± t({q:g}, n − 1) · s / √n, s the standard deviation of the "
                "seeds (n − 1 in the denominator), clipped to the range of the quantity. Exact for normal seeds; for "
                "accuracies over a hundred prompts it covers 94-96% at 3 to 10 seeds in simulation. One seed: no "
                "interval. All seeds equal: zero width, said so."
            ),
            (
                "Effect against the baseline: at each seed both arms ran, d = arm − baseline; the mean of d with the "
                "interval above; d_z = mean(d) / s_d; the paired t-test t = mean(d) / (s_d / √n), n − 1 degrees of "
                "freedom, two-sided p; Holm's correction over the arms compared on a metric (sort the m p-values, "
                "multiply the k-th smallest by m − k + 1, keep them non-decreasing, cap at 1)."
            ),
            (
                "Minimum detectable effect (MDE) over seeds: the smallest δ that the paired t-test at level α/m (α = 0.05, "
                "m the arms compared) rejects with probability 0.8 when its statistic follows the noncentral "
                "t(n − 1, δ √n / s_d), solved numerically (the sum t(1 − α/2m, n − 1) + t(0.8, n − 1) times s_d / √n comes "
                "close from below); it is proportional to s_d, so its interval is MDE · √((n − 1) / χ²(q, n − 1)) to "
                "MDE · √((n − 1) / χ²(1 − q, n − 1)) (the chi-square interval of s_d)."
            ),
            (
                "Two-level analysis (seeds × prompts), where every paired run wrote the per-prompt outcomes of its "
                "final validation (val/accuracy): D[s, p] = arm − baseline at seed s on prompt p (each prompt's mean "
                "score over its samples), over the S paired seeds and the P prompts they all validated on; seeds and "
                "prompts are crossed (every seed validates on the same prompts). Mean squares: MS_seed = P Σ_s (D_s − D)² "
                "/ (S − 1), MS_prompt = S Σ_p (D_p − D)² / (P − 1), MS_residual = Σ_sp (D_sp − D_s − D_p + D)² / ((S − 1)"
                "(P − 1)), with D_s, D_p and D the means of seed s, of prompt p and of all; the prompt-level variance "
                "σ²_prompt = max(0, (MS_prompt − MS_residual) / S). se² = MS_seed / (S P) + σ²_prompt / P: the seed-level "
                "variance s_d² / S of the seeds' mean differences plus the prompt-level variance / P. Degrees of freedom: "
                "S − 1 when σ²_prompt = 0 (then this is the t-interval over seeds exactly), else Satterthwaite's se⁴ / "
                "Σ_i (MS_i / (S P))² / dof_i over MS_seed, MS_prompt and MS_residual (dof_i S − 1, P − 1, (S − 1)(P − 1)). "
                f"Interval mean(D) ± t({q:g}, dof) · se; t = mean(D) / se, two-sided p on dof; the TOST below with "
                "this se and dof. It holds the difference over new seeds and new prompts of the task: a seed-level "
                "interval misses the prompt-level variance (an arm that helps on some prompts only), and a "
                "percentile bootstrap of seeds and prompts is too narrow at few seeds (table below)."
            ),
            (
                "MDE of a two-level design of S' seeds and P' prompts: the smallest δ that the test at level α/m rejects "
                "with probability 0.8 when mean(D) / √v follows the noncentral t(dof', δ / √v), solved numerically as "
                "over seeds (λ(dof') · √v, λ the noncentrality of 80% power; the sum t(1 − α/2m, dof') + t(0.8, dof') "
                "falls short by 9% at dof' = 3 and α/m = 0.05/6), v = "
                "σ²_seed / S' + MS_residual / (S' P') + σ²_prompt / P' with the unbiased σ²_seed = (MS_seed − MS_residual) / P "
                "(it may be negative; no MDE where v is not positive) and dof' = dof · (S' − 1) / (S − 1), dof the interval's; "
                "at the design run (S' = S, P' = P) v is se² and dof' = dof. Its "
                "interval replaces v by dof · v / χ²(q, dof) and dof · v / χ²(1 − q, dof) (the chi-square of the "
                "Satterthwaite variance). The Effects section gives it at S and P, and with twice the seeds or prompts."
            ),
            (
                f"Seeds for a target MDE δ* ({target_mde:g} on accuracies and shares, {target_mde * 100:g}% of the "
                "baseline's mean elsewhere; kept in data/sweep.json, `--target-mde`), on val/accuracy: the smallest S' "
                f"from 2 to {MAX_SEEDS:,} with λ(dof') · √v(S') ≤ δ* (the MDE above, 80% power on the noncentral t), "
                "v(S') = σ²_seed / S' + MS_residual / (S' P) + σ²_prompt / P at the P prompts run and dof' = dof · (S' − 1) "
                "/ (S − 1) (at S' = S the MDE above); and again at the upper end of each term's interval: the seeds' "
                "terms v(S') − σ²_prompt / P times dof / χ²(1 − q, dof), σ²_prompt at the upper end of its own: "
                "Satterthwaite's dof_p σ²_prompt / χ²(1 − q, dof_p), dof_p = (MS_prompt − MS_residual)² / (MS_prompt² / (P − 1) "
                "+ MS_residual² / ((S − 1)(P − 1))), but at most MS_prompt (P − 1) / (S χ²(1 − q, P − 1)), which holds "
                "whatever σ²_residual is. Unlimited seeds leave λ(∞) · √(σ²_prompt / P) (λ(∞) ≈ z(1 − α/2m) + z(0.8), "
                "the normal test's): where that is not below δ*, no number of seeds reaches it and more prompts are needed."
            ),
            (
                f"P(arm > baseline): the share of the n paired seeds at which the arm ended higher, a tie counting half "
                f"(the probability of improvement of Agarwal et al., 2021, paired by seed), with its {confidence:.0%} "
                "Wilson interval over the n seeds (formula below)."
            ),
            (
                "Seeds: the median and the interquartile mean (IQM, the mean after dropping ⌊n/4⌋ seeds from each end) "
                "beside the mean. A seed is far from its arm's others when, with x̄ and s the mean and standard "
                "deviation of the other n − 1 seeds, |x − x̄| / (s √(1 + 1/(n − 1))) exceeds t(1 − "
                f"{OUTLIER_ALPHA:g}/2n, n − 2) (Bonferroni over the seeds: at most a {OUTLIER_ALPHA:g} chance for an arm "
                f"of normal seeds) and |x − x̄| reaches the practical threshold; from {OUTLIER_MIN_SEEDS} seeds. An arm "
                f"with no such seed is checked as a whole from {SPREAD_MIN_SEEDS} seeds: Shapiro and Wilk's test of "
                f"normality at {SPREAD_ALPHA:g} (one arm of normal seeds in twenty flagged by chance) finds several "
                "collapsed seeds, which widen s and so hide each other from the test of one, and two clusters. Intervals "
                "over seeds assume seeds spread around one value: under collapse they cover less (table below), and "
                "with few seeds a collapse rate goes unseen whenever no seed collapsed (a third of 5-seed sweeps at 20%)."
            ),
            (
                f"Equivalence (TOST) within a margin δ: {margin:g} on accuracies and shares (whose scale is 1), "
                f"{margin * 100:g}% of the baseline's mean elsewhere (tokens, KL, seconds and rewards have no scale of their "
                "own; a reward's is set by its functions and weights); the margin is kept in data/sweep.json "
                "(`--equivalence-margin`). Two one-sided paired t-tests, t = (mean(d) + δ) / (s_d / √n) "
                "against mean(d) ≤ −δ and t = (mean(d) − δ) / (s_d / √n) against mean(d) ≥ +δ, n − 1 degrees of freedom; "
                "p is the larger one-sided p, Holm-corrected over the arms compared as the paired test is, so that the "
                f"chance of any false claim of equivalence on a metric stays below {ALPHA:g}. For one arm, p < {ALPHA:g} "
                f"is the {1 - 2 * ALPHA:.0%} t-interval of mean(d) lying inside (−δ, +δ)."
            ),
            (
                f"Verdict: better / worse when the Holm-corrected p is below {ALPHA:g} and |mean(d)| reaches the "
                f"practical threshold ({PRACTICAL_ABSOLUTE:g} on accuracies and shares, {PRACTICAL_RELATIVE:.0%} of the "
                f"baseline's mean elsewhere; else below the practical threshold); otherwise equivalent (±δ) when the "
                f"Holm-corrected equivalence p is below {ALPHA:g}: evidence of no difference larger than δ; otherwise "
                "undetermined, with the MDE: the data show neither a difference nor its absence. "
                f"Below {MIN_PAIRED_SEEDS} paired seeds, no verdict. Intervals that do not overlap are not a test and are "
                "never used as one."
            ),
            (
                "Training reward is compared only between arms with the same reward functions and weights; arms that "
                "logged the same reward, kl and val/accuracy at every step of every seed, and arms that started from "
                "another val/accuracy than the baseline at the same seed, are flagged in the Summary."
            ),
            (
                "Interval of one run's accuracy: over its validation prompts. From its per-prompt outcomes where it "
                "wrote them: Clopper and Pearson's exact binomial interval of m N successes of N, N = m (1 − m) P / s² "
                "the effective number of completions (P prompts of mean m and variance s², one value at 0 and one at 1 "
                "added; between P and P n for n completions a prompt). Else the interval the run logged, else the "
                "Wilson score interval (p + z²/2n ± z √(p(1 − p)/n + z²/4n²)) / (1 + z²/n). The sampling of prompts "
                "only, not of seeds."
            ),
            (
                "Step: an optimizer step (a rollout may make several; DAPO's dynamic sampling can spend several "
                "generation batches on one update); generated tokens are cumulative."
            ),
        ]
    )
    coverage_table(doc)


def coverage_table(doc: Doc) -> None:
    """The coverage of the intervals of ``arm - baseline``, as ``benchmarks/interval_coverage.py`` simulated it."""
    doc.p(
        f"Coverage of the 95% intervals of arm − baseline, simulated ({COVERAGE_SIMULATIONS:,} sweeps per row, "
        f"{COVERAGE_PROMPTS} prompts; `benchmarks/interval_coverage.py` describes the scenarios and reruns them): the "
        "two-level t-interval (used with per-prompt outcomes), the t-interval over seeds (used without), and the "
        "two-level percentile bootstrap (seeds, then prompts within each seed; not used)."
    )
    doc.table(["scenario", "seeds", "two-level t", "seed t", "two-level bootstrap"],
              [[name, str(seeds), *(f"{v:.1%}" for v in values)] for (name, seeds), values in COVERAGE.items()])  # fmt: skip
    found = "; ".join(f"{seeds} seeds: {f:.0%} found, {n:.0%} false" for seeds, (f, n) in DETECTION.items())
    doc.p(f"A single collapsed seed named by the check for far seeds in the collapse scenario, and any seed named "
          f"in the same scenario without collapse: {found}.")  # fmt: skip
    several = "; ".join(f"{seeds} seeds: {one:.0%} and {whole:.0%}, {false:.0%} false"
                        for seeds, (one, whole, false) in SPREAD_DETECTION.items())  # fmt: skip
    doc.p(f"Two or more collapsed seeds in the same scenario, named by the check for far seeds, and flagged by the check "
          f"of the whole arm where that names none; the whole arm flagged without collapse: {several}.")  # fmt: skip
