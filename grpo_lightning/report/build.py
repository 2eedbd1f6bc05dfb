"""``build_report``: the report document of a sweep, section by section, written as Markdown,
HTML, curve PNGs and the final-metrics table as CSV and LaTeX."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from grpo_lightning.report.arms import WIDE, Arm, pairwise_rows
from grpo_lightning.report.cells import CellInfo, arm_configs, discover_cells
from grpo_lightning.report.labels import check_arm_classes
from grpo_lightning.report.completions import completions_section
from grpo_lightning.report.curves import curves_section
from grpo_lightning.report.document import Doc
from grpo_lightning.report.effects import effects_section, ineffective_notes
from grpo_lightning.report.finals import final_section
from grpo_lightning.report.formatting import fmt, fmt_p, join_names
from grpo_lightning.report.health import health_section
from grpo_lightning.report.html import render_html
from grpo_lightning.report.markdown import render_markdown
from grpo_lightning.report.provenance import provenance_section, read_provenance, wall_clock_caveat
from grpo_lightning.report.runs import load_run
from grpo_lightning.report.summary import summary_paragraph
from grpo_lightning.report.validation import evaluation_section

#: The report's folder inside the sweep folder, unless another is given.
DEFAULT_FOLDER = "report"


def build_report(
    sweep_dir: str | Path,
    output: str | Path | None = None,
    name: str | None = None,
    confidence: float = 0.95,
    provenance: Sequence[str] = (),
) -> Path:
    """Write ``report.md``, ``report.html``, the curve PNGs, ``final_metrics.csv`` and
    ``final_metrics.tex`` of a sweep into ``output`` (default: ``<sweep_dir>/report``); returns it.

    ``name``: the report's title (default: the sweep folder's name). The Provenance section comes
    from the sweep's ``provenance.json``; ``provenance`` adds lines of the caller's.
    """
    sweep_dir = Path(sweep_dir)
    name = name or sweep_dir.resolve().name
    target = Path(output) if output is not None else sweep_dir / DEFAULT_FOLDER
    cells = discover_cells(sweep_dir)
    if not cells:
        raise FileNotFoundError(f"no runs under {sweep_dir}: expected cell folders of grpo-lightning-ablate")
    check_arm_classes(cells)  # each arm's class from its resolved configs: a mislabelled arm is refused
    target.mkdir(parents=True, exist_ok=True)
    finished = [c for c in cells if c.finished]
    unfinished = [c for c in cells if not c.finished]
    arms = load_arms(finished)
    records = read_provenance(sweep_dir)
    caveat = wall_clock_caveat(records)
    configs, inconsistent = arm_configs([c for arm in arms for c in arm.cells])
    notes = ineffective_notes(arms, configs)

    doc = Doc()
    doc.h(1, f"Ablation report: {name}")
    doc.p(
        f"Sweep folder `{sweep_dir.resolve().name}`: {len(arms)} arms, {len(finished)} finished runs"
        + (f", {len(unfinished)} unfinished (left out)" if unfinished else "")
        + f". Intervals of means over seeds are {confidence:.0%} percentile-bootstrap intervals; see Method."
    )
    doc.h(2, "Summary")
    doc.p(summary_paragraph(arms, confidence, caveat))
    if notes:
        doc.p(f"Settings without effect: clip settings of {join_names(_noted(arms, notes))} never clipped a "
              "token; see the section of that name.")  # fmt: skip

    _runs_section(doc, arms, unfinished)
    _config_section(doc, arms, configs, inconsistent)
    effects_section(doc, notes)
    final_section(doc, arms, confidence, target, name, caveat)
    evaluation_section(doc, arms, confidence)
    _pairwise_section(doc, arms)
    health_section(doc, arms)
    completions_section(doc, arms)
    curves_section(doc, arms, target, caveat)
    _method_section(doc, confidence)
    provenance_section(doc, records, provenance)

    (target / "report.md").write_text(render_markdown(doc))
    (target / "report.html").write_text(render_html(doc, f"Ablation report: {name}"))
    return target


def load_arms(finished: Sequence[CellInfo]) -> list[Arm]:
    """The finished cells grouped into arms, in the order of ``VARIANT_ORDER``."""
    arms: dict[str, Arm] = {}
    for cell in finished:
        arms.setdefault(cell.arm, Arm(cell.arm, [], []))
        arms[cell.arm].cells.append(cell)
        arms[cell.arm].runs.append(load_run(cell.directory))
    return [arms[a] for a in sorted(arms, key=lambda a: _arm_order(a, finished))]


def _noted(arms: Sequence[Arm], notes: Sequence[str]) -> list[str]:
    return [a.name for a in arms if any(n.startswith(f"**{a.name}**") for n in notes)]


#: The order of the built-in variants in tables and plots; other arms follow by name.
VARIANT_ORDER = ["grpo", "dr_grpo", "dapo", "rloo", "gspo", "cispo", "sapo", "gmpo", "reinforce_plus_plus", "clip_cov", "kl_cov"]


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


def _config_section(doc: Doc, arms: Sequence[Arm], configs: dict, inconsistent: dict) -> None:
    doc.h(2, "Configuration")
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
        doc.table(
            ["setting", *names],
            [[f"`{k}`", *(configs.get(a, {}).get(k, "—") for a in names)] for k in differing],
            "l" * (len(names) + 1),
        )
    else:
        doc.p("None: every arm has the same configuration.")
    for arm in names:
        if inconsistent.get(arm):
            doc.p(f"Warning: the seeds of **{arm}** differ in " + ", ".join(f"`{k}`" for k in inconsistent[arm]) + ".")
    body = Doc()
    body.table(["setting", "value"], [[f"`{k}`", configs[names[0]].get(k, "—")] for k in shared], "ll")
    doc.details(f"Settings shared by every arm ({len(shared)})", body)


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


def _method_section(doc: Doc, confidence: float) -> None:
    doc.h(2, "Method")
    doc.items(
        [
            "Runs of one arm differ only in their seed; each finished run counts once (unfinished runs are left out).",
            "Final metric: the last value logged by the run; for val/* the last validation.",
            (
                f"Interval of a mean over seeds: percentile bootstrap, the {(1 - confidence) / 2:g} and "
                f"{(1 + confidence) / 2:g} quantiles of the means of 10,000 resamples (with replacement, fixed "
                "generator seed) of the runs' final values; it lies within the range of the runs and is clipped "
                "to the range of the quantity. With few seeds it is narrow (with 3 seeds it cannot be wider "
                "than their range): read it as the spread of the seeds, and the Welch test for differences."
            ),
            (
                "Interval of one run's accuracy: the bootstrap over prompts the run logged, else the Wilson score "
                "interval (p + z²/2n ± z √(p(1 − p)/n + z²/4n²)) / (1 + z²/n) over its n validation prompts."
            ),
            (
                "Welch's t-test: t = (mean A − mean B) / √(s²A/nA + s²B/nB), Welch-Satterthwaite degrees of "
                "freedom, two-sided p; Holm's correction over all pairs of arms of a metric."
            ),
            (
                "Summary: an arm is named the best on a metric only when its difference to every other arm is "
                "significant after Holm's correction or larger than both intervals (they do not overlap); "
                "otherwise the arms within reach tie."
            ),
            (
                "Step: an optimizer step (a rollout may make several; DAPO's dynamic sampling can spend several "
                "generation batches on one update); generated tokens are cumulative."
            ),
        ]
    )
