"""``build_report``: the report document of a sweep, section by section, written as Markdown,
HTML and curve PNGs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from grpo_lightning.report.arms import (
    FINAL_METRICS,
    PER_RUN_METRICS,
    Arm,
    best_index,
    final_value,
    fmt,
    fmt_p,
    pairwise_rows,
    summary_paragraph,
)
from grpo_lightning.report.cells import CellInfo, arm_configs, discover_cells
from grpo_lightning.report.document import Doc
from grpo_lightning.report.html import render_html
from grpo_lightning.report.markdown import render_markdown
from grpo_lightning.report.plots import plot_curves
from grpo_lightning.report.runs import load_run
from grpo_lightning.report.statistics import mean_ci

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


def build_report(
    sweep_dir: str | Path,
    out_dir: str | Path,
    name: str | None = None,
    confidence: float = 0.95,
    provenance: Sequence[str] = (),
) -> Path:
    """Write ``report.md``, ``report.html`` and the curve PNGs of a sweep; returns the folder.

    ``provenance``: lines for a "Provenance" section (the command, commit and machine that ran
    the sweep), given by the caller so the report stays a pure function of its inputs.
    """
    sweep_dir = Path(sweep_dir)
    name = name or sweep_dir.resolve().name
    target = Path(out_dir) / name
    target.mkdir(parents=True, exist_ok=True)

    cells = discover_cells(sweep_dir)
    if not cells:
        raise FileNotFoundError(f"no runs under {sweep_dir}: expected cell folders of grpo-lightning-ablate")
    finished = [c for c in cells if c.finished]
    unfinished = [c for c in cells if not c.finished]
    arms: dict[str, Arm] = {}
    for cell in finished:
        arms.setdefault(cell.arm, Arm(cell.arm, [], []))
        arms[cell.arm].cells.append(cell)
        arms[cell.arm].runs.append(load_run(cell.directory))
    arm_list = [arms[a] for a in sorted(arms, key=lambda a: _arm_order(a, finished))]

    doc = Doc()
    doc.h(1, f"Ablation report: {name}")
    doc.p(
        f"Sweep folder `{sweep_dir.resolve().name}`: {len(arm_list)} arms, {len(finished)} finished runs"
        + (f", {len(unfinished)} unfinished (left out)" if unfinished else "")
        + f". Intervals are {confidence:.0%} Student-t confidence intervals over seeds."
    )
    doc.h(2, "Summary")
    doc.p(summary_paragraph(arm_list))

    _runs_section(doc, arm_list, unfinished)
    _config_section(doc, arm_list)
    _final_section(doc, arm_list, confidence)
    _pairwise_section(doc, arm_list)
    _curves_section(doc, arm_list, target)
    _notes_section(doc, confidence)
    if provenance:
        doc.h(2, "Provenance")
        doc.items(list(provenance))

    (target / "report.md").write_text(render_markdown(doc))
    (target / "report.html").write_text(render_html(doc, f"Ablation report: {name}"))
    return target


#: The order of the built-in variants in tables and plots; other arms follow by name.
VARIANT_ORDER = ["grpo", "dr_grpo", "dapo", "rloo", "gspo", "cispo", "sapo", "gmpo", "reinforce_plus_plus", "clip_cov", "kl_cov"]
#: Above this many arms the report turns wide: arms become rows ranked by final val/accuracy, the
#: pairwise table keeps the significant pairs (all of them in a collapsed section) and the curves
#: are drawn in groups of ``CURVE_GROUP`` arms.
WIDE = 6
CURVE_GROUP = 4


def _arm_order(arm: str, cells: Sequence[CellInfo]) -> tuple:
    variant = next((c.variant for c in cells if c.arm == arm), arm)
    rank = VARIANT_ORDER.index(variant) if variant in VARIANT_ORDER else len(VARIANT_ORDER)
    return (rank, variant, arm)


def _runs_section(doc: Doc, arms: Sequence[Arm], unfinished: Sequence[CellInfo]) -> None:
    doc.h(2, "Runs")
    rows = []
    for arm in arms:
        seeds = ", ".join(str(c.seed) for c in arm.cells)
        overrides = ", ".join(f"`{k}`={v}" for k, v in sorted(arm.cells[0].overrides.items())) or "—"
        rows.append([f"**{arm.name}**", arm.cells[0].variant or "—", overrides, seeds, str(len(arm.runs))])
    doc.table(["arm", "variant", "overrides", "seeds", "runs"], rows, "lllll")
    if unfinished:
        doc.p("Unfinished cells (no `DONE` marker; not counted): " + ", ".join(f"`{c.name}`" for c in unfinished) + ".")


def _config_section(doc: Doc, arms: Sequence[Arm]) -> None:
    doc.h(2, "Configuration")
    configs, inconsistent = arm_configs([c for arm in arms for c in arm.cells])
    names = [a.name for a in arms]
    keys = sorted({k for a in names for k in configs.get(a, {})})
    differing = [k for k in keys if len({configs.get(a, {}).get(k, "—") for a in names}) > 1]
    shared = [k for k in keys if k not in differing]
    if not keys:
        doc.p("No saved `config.yaml` found in the run folders.")
        return
    doc.p(
        "From each run's `config.yaml` (the resolved configuration LightningCLI saved). Per-run paths "
        "and the seed are left out. Settings that differ between arms:"
    )
    if differing and len(names) > WIDE:  # one row per arm: the differing settings it has
        rows = [[f"**{a}**", ", ".join(f"`{k.removeprefix('model.init_args.')}`={configs.get(a, {})[k]}"
                                        for k in differing if k in configs.get(a, {}))] for a in names]  # fmt: skip
        doc.table(["arm", "settings that differ between arms (`model.init_args.` left out)"], rows, "ll")
    elif differing and len(names) > 1:
        doc.table(["setting", *names], [[f"`{k}`", *(configs.get(a, {}).get(k, "—") for a in names)] for k in differing], "l" * (len(names) + 1))
    else:
        doc.p("None: every arm has the same configuration.")
    for arm in names:
        if inconsistent.get(arm):
            doc.p(f"Warning: the seeds of **{arm}** differ in " + ", ".join(f"`{k}`" for k in inconsistent[arm]) + ".")
    body = Doc()
    body.table(["setting", "value"], [[f"`{k}`", configs[names[0]].get(k, "—")] for k in shared], "ll")
    doc.details(f"Settings shared by every arm ({len(shared)})", body)


def _final_section(doc: Doc, arms: Sequence[Arm], confidence: float) -> None:
    doc.h(2, "Final metrics")
    doc.p(
        f"Last logged value of each run; mean [{confidence:.0%} CI] over seeds (n = runs). "
        "**Bold**: the best arm where higher (accuracy, reward) or lower (tokens, time) is better, unless tied."
    )
    metrics, cells = [], []  # cells[m][a]: the text of metric m for arm a
    for key, label, direction in FINAL_METRICS:
        stats = [mean_ci(a.finals(key), confidence) for a in arms]
        if all(not math.isfinite(s[0]) for s in stats):
            continue
        best = best_index([s[0] for s in stats], direction) if len(arms) > 1 else None
        texts = [fmt(mean) if not math.isfinite(low) else f"{fmt(mean)} [{fmt(low)}, {fmt(high)}]" for mean, low, high in stats]
        metrics.append(label)
        cells.append([f"**{text}**" if i == best else text for i, text in enumerate(texts)])
    names = [f"{a.name} (n={len(a.runs)})" for a in arms]
    if len(arms) > WIDE:  # one row per arm, best final val/accuracy first
        order = ranked(arms)
        doc.p("Arms are ranked by their mean final val/accuracy.")
        doc.table(["rank", "arm", *metrics], [[str(r + 1), names[i], *(c[i] for c in cells)] for r, i in enumerate(order)],
                  "rl" + "r" * len(metrics))  # fmt: skip
    else:
        doc.table(["metric", *names], [[label, *row] for label, row in zip(metrics, cells)])
    keys = [(k, label) for k, label, _ in FINAL_METRICS if k in PER_RUN_METRICS]
    body = Doc()
    body.table(
        ["run", "seed", *(label for _, label in keys)],
        [
            [cell.name, str(cell.seed), *(fmt(final_value(run, k)) for k, _ in keys)]
            for arm in arms
            for cell, run in zip(arm.cells, arm.runs)
        ],
        "ll" + "r" * len(keys),
    )
    doc.details("Final values of every run", body)


def _pairwise_section(doc: Doc, arms: Sequence[Arm]) -> None:
    doc.h(2, "Pairwise comparison on final val/accuracy")
    doc.p(
        "Welch's two-sided t-test (unequal variances) of the final val/accuracy of every pair of arms; "
        "`dof` is the Welch-Satterthwaite degrees of freedom and `p (Holm)` corrects for the number of pairs."
    )
    rows = pairwise_rows(arms)
    if not rows:
        doc.p("Only one arm: nothing to compare.")
        return
    header = ["A", "B", "n A", "n B", "mean A − B", "t", "dof", "p", "p (Holm)", "verdict"]

    def table_rows(selected):
        return [
            [r["a"], r["b"], str(r["n_a"]), str(r["n_b"]), fmt(r["mean_a"] - r["mean_b"]), fmt(r["t"]),
             fmt(r["dof"]), fmt_p(r["p"]), fmt_p(r["p_holm"]), r["verdict"]]
            for r in selected
        ]  # fmt: skip

    if len(arms) <= WIDE:
        doc.table(header, table_rows(rows), "llrrrrrrrl")
        return
    significant = [r for r in rows if math.isfinite(r["p_holm"]) and r["p_holm"] < 0.05]
    if significant:
        doc.p(f"The {len(significant)} of {len(rows)} pairs that differ significantly after Holm's correction:")
        doc.table(header, table_rows(significant), "llrrrrrrrl")
    else:
        doc.p(f"None of the {len(rows)} pairs differs significantly after Holm's correction.")
    body = Doc()
    body.table(header, table_rows(rows), "llrrrrrrrl")
    doc.details(f"All {len(rows)} pairs", body)


def _curves_section(doc: Doc, arms: Sequence[Arm], target: Path) -> None:
    doc.h(2, "Learning curves")
    doc.p(
        "Mean over seeds where every seed has data (linear interpolation between logged points); the band "
        "is ± one standard deviation across seeds. Columns: against training "
        "steps, against completion tokens generated (compute-normalised) and against wall-clock seconds "
        "since training began (validation time included). Step 0 of val/accuracy is the "
        "validation before training, when it was run."
    )
    groups = [arms]
    if len(arms) > WIDE:
        order = [arms[i] for i in ranked(arms)]
        groups = [order[start : start + CURVE_GROUP] for start in range(0, len(order), CURVE_GROUP)]
        doc.p(f"With {len(arms)} arms the curves come in groups of {CURVE_GROUP}, in the order of their final "
              "val/accuracy (the first group holds the best arms).")  # fmt: skip
    for stem, title, tags in CURVES:
        if not any(tag in run.scalars or tag in run.initial for arm in arms for run in arm.runs for tag in tags):
            continue
        doc.h(3, title)
        for number, group in enumerate(groups, start=1):
            filename = f"curves_{stem}.png" if len(groups) == 1 else f"curves_{stem}_{number}.png"
            heading = title if len(groups) == 1 else f"{title}: {', '.join(a.name for a in group)}"
            plot_curves(group, tags, heading, target / filename)
            doc.img(heading, filename)


def ranked(arms: Sequence[Arm], key: str = "val/accuracy") -> list[int]:
    """Indices of ``arms``, the highest mean final ``key`` first (arms without it last, in table order)."""

    def score(i: int) -> float:
        values = arms[i].finals(key)
        return -float(sum(values) / len(values)) if values else math.inf

    return sorted(range(len(arms)), key=score)


def _notes_section(doc: Doc, confidence: float) -> None:
    doc.h(2, "Method")
    doc.items(
        [
            "Runs of one arm differ only in their seed; each finished run counts once (unfinished runs are left out).",
            "Final metric: the last value logged by the run; for val/* the last validation.",
            f"Confidence interval: mean ± t({(1 + confidence) / 2:g}, n − 1) · s / √n with s the sample standard deviation.",
            "Welch's t-test: t = (mean A − mean B) / √(s²A/nA + s²B/nB), Welch-Satterthwaite degrees of freedom, two-sided p.",
            "Training step: a step that ended in a policy update and logged training metrics (DAPO's dynamic "
            "sampling can spend several rollout batches on one); generated tokens are cumulative.",
        ]
    )
