"""``build_report``: the report document of a sweep, section by section, written as Markdown,
HTML, curve PNGs and the final-metrics table as CSV and LaTeX."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from grpo_lightning.errors import ConfigError
from grpo_lightning.report.arms import SMOOTHING_STEPS, WIDE, Arm
from grpo_lightning.report.cells import DATA_MARKER, CellInfo, arm_configs, discover_cells
from grpo_lightning.report.labels import check_arm_classes
from grpo_lightning.report.learning import curve_metrics, threshold_note
from grpo_lightning.report.sections.comparisons import (
    ALPHA,
    EQUIVALENCE_MARGIN,
    MIN_PAIRED_SEEDS,
    PRACTICAL_ABSOLUTE,
    PRACTICAL_RELATIVE,
    comparison_section,
)
from grpo_lightning.report.sections.budgets import budget_section, matched_budgets, verdict_changes
from grpo_lightning.report.sections.completions import completions_section
from grpo_lightning.report.sections.curves import curves_section
from grpo_lightning.report.render.document import Doc, user_text
from grpo_lightning.report.sections.effects import effects_section, ineffective_notes
from grpo_lightning.report.sections.finals import final_section
from grpo_lightning.report.data import DATA_FOLDER, REGENERATE_FILE, export_data, is_data_folder, read_sweep_record, regenerate_line
from grpo_lightning.report.render.formatting import join_names
from grpo_lightning.report.sections.health import health_section
from grpo_lightning.report.render.html import render_html
from grpo_lightning.report.render.markdown import render_markdown
from grpo_lightning.report.sections.provenance import (
    command_line_notes,
    provenance_section,
    provenance_warnings,
    read_provenance,
    wall_clock_caveat,
)
from grpo_lightning.report.runs import load_run, optimizer_steps_per_rollout
from grpo_lightning.report.sections.summary import summary_paragraph
from grpo_lightning.report.sections.validation import evaluation_section

#: The report's folder inside the sweep folder, unless another is given.
DEFAULT_FOLDER = "report"


def build_report(
    sweep_dir: str | Path,
    output: str | Path | None = None,
    name: str | None = None,
    confidence: float = 0.95,
    provenance: Sequence[str] = (),
    baseline: str | None = None,
    equivalence_margin: float | None = None,
) -> Path:
    """Write ``report.md``, ``report.html``, the curve PNGs, ``final_metrics.csv`` and
    ``final_metrics.tex`` of a sweep into ``output`` (default: ``<sweep_dir>/report``); returns it.

    From a sweep folder, the report first copies what it reads into ``output/data`` and writes
    ``output/REGENERATE``, then is built from that copy; from such a ``data`` folder (default
    output: the folder that holds it) it is rebuilt, byte for byte. ``name``: the report's title
    (default: the sweep folder's name). The Provenance section comes from the sweep's
    ``provenance.json``; ``provenance`` adds lines of the caller's. ``baseline``: the arm every other
    is compared with, in place of the sweep's ``baseline`` (kept in ``data/sweep.json``).
    ``equivalence_margin``: the margin of the equivalence verdict (default ``EQUIVALENCE_MARGIN``;
    kept in ``data/sweep.json``).
    """
    sweep_dir = Path(sweep_dir)
    if is_data_folder(sweep_dir):
        target = Path(output) if output is not None else sweep_dir.resolve().parent
        if baseline is not None:
            raise ConfigError("baseline: a data folder keeps the baseline it was exported with; build from the sweep folder")
        if equivalence_margin is not None:
            raise ConfigError("equivalence_margin: a data folder keeps the margin it was exported with; change "
                              f"`equivalence_margin` in its {DATA_MARKER} or build from the sweep folder")  # fmt: skip
        return _build(sweep_dir, target, name, confidence, provenance)
    target = Path(output) if output is not None else sweep_dir / DEFAULT_FOLDER
    cells = discover_cells(sweep_dir)
    if not cells:
        raise FileNotFoundError(f"no runs under {sweep_dir}: expected cell folders of grpo-lightning-ablate")
    check_arm_classes(cells)  # each arm's class from its resolved configs: a mislabelled arm is refused
    target.mkdir(parents=True, exist_ok=True)
    margin = EQUIVALENCE_MARGIN if equivalence_margin is None else equivalence_margin
    export_data(sweep_dir, cells, target / DATA_FOLDER, name or sweep_dir.resolve().name, provenance, baseline, margin)
    (target / REGENERATE_FILE).write_text(regenerate_line(target / DATA_FOLDER, confidence))
    return _build(target / DATA_FOLDER, target, None, confidence, ())


def _build(data_dir: Path, target: Path, name: str | None, confidence: float, provenance: Sequence[str]) -> Path:
    """The report of a data folder (``report.data``) into ``target``."""
    meta = read_sweep_record(data_dir)
    name = name or meta.get("name") or data_dir.resolve().name
    provenance = list(provenance) or list(meta.get("provenance") or [])
    cells = discover_cells(data_dir)
    if not cells:
        raise FileNotFoundError(f"no runs under {data_dir}")
    target.mkdir(parents=True, exist_ok=True)
    finished = [c for c in cells if c.finished]
    unfinished = [c for c in cells if not c.finished]
    arms = load_arms(finished, unfinished)
    baseline = baseline_arm(arms, finished, meta.get("baseline"))
    margin = recorded_margin(meta)
    records = read_provenance(data_dir)
    caveat = wall_clock_caveat(records)
    configs, inconsistent = arm_configs([c for arm in arms for c in arm.cells])
    notes = ineffective_notes(arms, configs)

    doc = Doc()
    doc.h(1, f"Ablation report: {user_text(name)}")
    for line in provenance_warnings(records) + command_line_notes(records):
        doc.p(line)
    doc.p(
        f"Sweep folder `{user_text(meta.get('sweep_folder', data_dir.resolve().name))}`: {len(arms)} arms, {len(finished)} finished runs"
        + (f", {len(unfinished)} unfinished (left out)" if unfinished else "")
        + f". Intervals over seeds are {confidence:.0%} Student-t intervals; arms are compared with the baseline "
        + (f"**{user_text(baseline.name)}** " if baseline else "")
        + "by paired t-tests over shared seeds; see Method. The data this report is built from is in "
        f"[{DATA_FOLDER}/]({DATA_FOLDER}/), and `{REGENERATE_FILE}` rebuilds it."
    )
    doc.h(2, "Summary")
    doc.p(summary_paragraph(arms, baseline, confidence, caveat, configs, margin))
    matched = matched_budgets(arms, baseline, confidence, margin) if baseline is not None and len(arms) > 1 else []
    if verdict_changes(matched):
        doc.p(verdict_changes(matched))
    if notes:
        doc.p(f"Settings without effect: clip settings of {join_names(_noted(arms, notes))} never clipped a "
              "token; see the section of that name.")  # fmt: skip

    _runs_section(doc, arms, unfinished, baseline, chosen=bool(meta.get("baseline")))
    _config_section(doc, arms, configs, inconsistent)
    effects_section(doc, notes)
    curve_rows = curve_metrics(arms, baseline)
    final_section(doc, arms, confidence, target, name, caveat, curve_rows, threshold_note(curve_rows, baseline))
    evaluation_section(doc, arms, confidence)
    if baseline is not None:
        comparison_section(doc, arms, baseline, confidence, caveat, configs, margin)
        budget_section(doc, arms, baseline, confidence, target, margin, matched)
    health_section(doc, arms)
    completions_section(doc, arms)
    curves_section(doc, arms, target, caveat, baseline, confidence)
    _method_section(doc, confidence, margin)
    provenance_section(doc, records, provenance)

    (target / "report.md").write_text(render_markdown(doc))
    (target / "report.html").write_text(render_html(doc, f"Ablation report: {name}"))
    return target


def recorded_margin(meta: dict) -> float:
    """The equivalence margin a data folder was exported with (``EQUIVALENCE_MARGIN`` in one
    exported before the margin was kept)."""
    margin = meta.get("equivalence_margin", EQUIVALENCE_MARGIN)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 < margin < math.inf:
        raise ConfigError(f"equivalence_margin: {margin!r} in {DATA_MARKER} is no positive number; "
                          f"set one, e.g. {EQUIVALENCE_MARGIN}")  # fmt: skip
    return float(margin)


def baseline_arm(arms: Sequence[Arm], cells: Sequence[CellInfo], chosen: str | None = None) -> Arm | None:
    """``chosen`` (the report's choice), else the arm the sweep named as its baseline (``baseline`` in
    cell.json), else the first arm."""
    by_name = {a.name: a for a in arms}
    if chosen is not None:
        if chosen not in by_name:
            raise ConfigError(f"baseline: no arm is named {chosen!r}; the arms are {sorted(by_name)}")
        return by_name[chosen]
    named = [c.baseline for c in cells if c.baseline in by_name]
    return by_name[named[0]] if named else (arms[0] if arms else None)


def load_arms(finished: Sequence[CellInfo], unfinished: Sequence[CellInfo] = ()) -> list[Arm]:
    """The finished cells grouped into arms, in the order of ``VARIANT_ORDER``; each arm keeps its
    ``unfinished`` cells to count them among its seeds."""
    arms: dict[str, Arm] = {}
    for cell in finished:
        arms.setdefault(cell.arm, Arm(cell.arm, [], []))
        arms[cell.arm].cells.append(cell)
        run = load_run(cell.directory)
        run.updates_per_step = optimizer_steps_per_rollout(cell.config)
        arms[cell.arm].runs.append(run)
    for cell in unfinished:
        if cell.arm in arms:
            arms[cell.arm].unfinished.append(cell)
    return [arms[a] for a in sorted(arms, key=lambda a: _arm_order(a, finished))]


def _noted(arms: Sequence[Arm], notes: Sequence[str]) -> list[str]:
    return [a.name for a in arms if any(n.startswith(f"**{user_text(a.name)}**") for n in notes)]


#: The order of the built-in variants in tables and plots; other arms follow by name.
VARIANT_ORDER = ["grpo", "dr_grpo", "dapo", "rloo", "gspo", "cispo", "sapo", "gmpo", "reinforce_plus_plus", "clip_cov", "kl_cov",
                 "luspo", "vespo", "dppo", "gpg", "dro", "max_rl"]  # fmt: skip


def _arm_order(arm: str, cells: Sequence[CellInfo]) -> tuple:
    variant = next((c.variant for c in cells if c.arm == arm), arm)
    rank = VARIANT_ORDER.index(variant) if variant in VARIANT_ORDER else len(VARIANT_ORDER)
    return (rank, variant, arm)


def _runs_section(doc: Doc, arms: Sequence[Arm], unfinished: Sequence[CellInfo], baseline: Arm | None,
                  chosen: bool = False) -> None:  # fmt: skip
    doc.h(2, "Runs")
    if baseline is not None:
        origin = "chosen for this report" if chosen else "the sweep's `baseline`, else its first arm"
        doc.p(f"Baseline: **{user_text(baseline.name)}** ({origin}); every other arm is compared with it.")
    rows = []
    for arm in arms:
        seeds = ", ".join(str(c.seed) for c in arm.cells)
        overrides = ", ".join(f"`{k}`={v}" for k, v in sorted(arm.cells[0].overrides.items())) or "—"
        rows.append([f"**{user_text(arm.name)}**", arm.cells[0].variant or "—", overrides, seeds, str(len(arm.runs))])
    doc.table(["arm", "variant", "overrides", "seeds", "runs"], rows, "lllll")
    if unfinished:
        doc.p("Unfinished cells (no `DONE` marker; not counted): " + ", ".join(f"`{user_text(c.name)}`" for c in unfinished) + ".")


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
        rows = [[f"**{user_text(a)}**", ", ".join(f"`{k.removeprefix('model.init_args.')}`={configs.get(a, {})[k]}"
                                        for k in differing if k in configs.get(a, {}))] for a in names]  # fmt: skip
        doc.table(["arm", "settings that differ between arms (`model.init_args.` left out)"], rows, "ll")
    elif differing and len(names) > 1:
        doc.table(
            ["setting", *map(user_text, names)],
            [[f"`{k}`", *(configs.get(a, {}).get(k, "—") for a in names)] for k in differing],
            "l" * (len(names) + 1),
        )
    else:
        doc.p("None: every arm has the same configuration.")
    for arm in names:
        if inconsistent.get(arm):
            doc.p(f"Warning: the seeds of **{user_text(arm)}** differ in " + ", ".join(f"`{k}`" for k in inconsistent[arm]) + ".")
    body = Doc()
    body.table(["setting", "value"], [[f"`{k}`", configs[names[0]].get(k, "—")] for k in shared], "ll")
    doc.details(f"Settings shared by every arm ({len(shared)})", body)


def _method_section(doc: Doc, confidence: float, margin: float) -> None:
    doc.h(2, "Method")
    q = (1 + confidence) / 2
    doc.items(
        [
            "Runs of one arm differ only in their seed; each finished run counts once (unfinished runs are left out).",
            (
                f"Final value: the last validation for val/*; the mean of the last {SMOOTHING_STEPS} training steps for "
                "training metrics (one step is one batch of prompts); totals (tokens, steps, time) at the end."
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
                "Minimum detectable effect (MDE): (t(1 − α/2m, n − 1) + t(0.8, n − 1)) · s_d / √n with α = 0.05 and m the "
                "arms compared: a true difference this large is found 80% of the time; smaller ones mostly are not."
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
                "Interval of one run's accuracy: over its validation prompts (the bootstrap over prompts the run "
                "logged, else the Wilson score interval (p + z²/2n ± z √(p(1 − p)/n + z²/4n²)) / (1 + z²/n)): the "
                "sampling of prompts only, not of seeds."
            ),
            (
                "Step: an optimizer step (a rollout may make several; DAPO's dynamic sampling can spend several "
                "generation batches on one update); generated tokens are cumulative."
            ),
        ]
    )
