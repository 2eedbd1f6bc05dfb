"""``build_report``: the report document of a sweep, section by section, written as Markdown,
HTML, curve PNGs and the final-metrics table as CSV and LaTeX."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from grpo_lightning.errors import ConfigError
from grpo_lightning.variants import PRESETS
from grpo_lightning.report.arms import WIDE, Arm
from grpo_lightning.report.cells import (
    DATA_MARKER,
    CellInfo,
    arm_configs,
    check_one_design,
    discover_cells,
    recorded_baseline,
    refuse_cells_without_scalars,
)
from grpo_lightning.report.labels import check_arm_classes
from grpo_lightning.report.learning import curve_metrics, threshold_note
from grpo_lightning.report.sections.comparisons import EQUIVALENCE_MARGIN, TARGET_MDE, comparison_section
from grpo_lightning.report.sections.budgets import budget_section, matched_budgets, verdict_changes
from grpo_lightning.report.sections.completions import completions_section
from grpo_lightning.report.sections.curves import curves_section
from grpo_lightning.report.render.document import Doc, user_text
from grpo_lightning.report.sections.effects import effects_section, ineffective_notes
from grpo_lightning.report.sections.finals import final_section
from grpo_lightning.report.sections.seeds import seeds_section
from grpo_lightning.report.data import DATA_FOLDER, REGENERATE_FILE, export_data, is_data_folder, read_sweep_record, regenerate_line
from grpo_lightning.report.render.formatting import join_names
from grpo_lightning.report.sections.health import health_section
from grpo_lightning.report.sections.method import method_section
from grpo_lightning.report.render.html import render_html
from grpo_lightning.report.render.markdown import render_markdown
from grpo_lightning.report.sections.provenance import (
    command_line_notes,
    code_warnings,
    provenance_section,
    provenance_warnings,
    read_provenance,
    wall_clock_caveat,
)
from grpo_lightning.report.outcomes import cell_outcomes
from grpo_lightning.ablation.runs import load_run, optimizer_steps_per_rollout
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
    target_mde: float | None = None,
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
    kept in ``data/sweep.json``). ``target_mde``: the MDE the Effects section gives the seeds for (default
    ``TARGET_MDE``; kept in ``data/sweep.json``).
    """
    sweep_dir = Path(sweep_dir)
    if is_data_folder(sweep_dir):
        target = Path(output) if output is not None else sweep_dir.resolve().parent
        if baseline is not None:
            raise ConfigError("baseline: a data folder keeps the baseline it was exported with; build from the sweep folder")
        if equivalence_margin is not None:
            raise ConfigError("equivalence_margin: a data folder keeps the margin it was exported with; change "
                              f"`equivalence_margin` in its {DATA_MARKER} or build from the sweep folder")  # fmt: skip
        if target_mde is not None:
            raise ConfigError("target_mde: a data folder keeps the target MDE it was exported with; change "
                              f"`target_mde` in its {DATA_MARKER} or build from the sweep folder")  # fmt: skip
        return _build(sweep_dir, target, name, confidence, provenance)
    target = Path(output) if output is not None else sweep_dir / DEFAULT_FOLDER
    cells = discover_cells(sweep_dir)
    if not cells:
        raise FileNotFoundError(f"no runs under {sweep_dir}: expected cell folders of grpo-lightning-ablate")
    check_arm_classes(cells)  # each arm's class from its resolved configs: a mislabelled arm is refused
    check_one_design(cells)  # an earlier sweep's cells of other settings left in the folder are refused
    refuse_cells_without_scalars(cells)
    if baseline is None:
        recorded_baseline([c for c in cells if c.finished])  # cells of jobs that named other baselines are refused
    target.mkdir(parents=True, exist_ok=True)
    margin = EQUIVALENCE_MARGIN if equivalence_margin is None else equivalence_margin
    target_mde = TARGET_MDE if target_mde is None else target_mde
    export_data(sweep_dir, cells, target / DATA_FOLDER, name or sweep_dir.resolve().name, provenance, baseline, margin,
                target_mde)  # fmt: skip
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
    check_one_design(cells)
    refuse_cells_without_scalars(cells)
    target.mkdir(parents=True, exist_ok=True)
    finished = [c for c in cells if c.finished]
    unfinished = [c for c in cells if not c.finished]
    arms = load_arms(finished, unfinished)
    unpaired = attach_outcomes(arms)
    baseline = baseline_arm(arms, finished, meta.get("baseline"))
    margin = recorded_margin(meta)
    target_mde = recorded_target_mde(meta)
    records = read_provenance(data_dir)
    caveat = wall_clock_caveat(records)
    configs, inconsistent = arm_configs([c for arm in arms for c in arm.cells])
    notes = ineffective_notes(arms, configs)

    doc = Doc()
    doc.h(1, f"Ablation report: {user_text(name)}")
    for line in provenance_warnings(records, finished) + code_warnings(finished) + command_line_notes(records):
        doc.p(line)
    errata = meta.get("notes") or []  # found after the runs, kept in data/sweep.json: a list, or one text
    for note in [errata] if isinstance(errata, str) else errata:
        doc.p("**Note:** " + user_text(note))
    doc.p(
        f"Sweep folder `{user_text(meta.get('sweep_folder', data_dir.resolve().name))}`: {len(arms)} arms, {len(finished)} finished runs"
        + (f", {len(unfinished)} unfinished (left out)" if unfinished else "")
        + f". Intervals over seeds are {confidence:.0%} Student-t intervals; arms are compared with the baseline "
        + (f"**{user_text(baseline.name)}** " if baseline else "")
        + "by paired t-tests over shared seeds (and shared prompts, where the runs wrote per-prompt outcomes); see "
        "Method. The data this report is built from is in "
        f"[{DATA_FOLDER}/]({DATA_FOLDER}/), and `{REGENERATE_FILE}` rebuilds it."
    )
    doc.h(2, "Summary")
    doc.p(summary_paragraph(arms, baseline, confidence, caveat, configs, margin))
    if unpaired:
        doc.p(f"Per-prompt outcomes are not used, comparisons are over seeds only: {user_text(unpaired)}")
    matched = matched_budgets(arms, baseline, confidence, margin) if baseline is not None and len(arms) > 1 else []
    if verdict_changes(matched):
        doc.p(verdict_changes(matched))
    if notes:
        noted = _noted(arms, notes)  # an arm's note may name one bound of several: the section says which
        doc.p(f"Settings without effect: {join_names(noted)} {'has' if len(noted) == 1 else 'each have'} a clip "
              "setting that never clipped a token; see the section of that name.")  # fmt: skip

    _runs_section(doc, arms, unfinished, baseline, chosen=bool(meta.get("baseline")))
    _config_section(doc, arms, configs, inconsistent)
    effects_section(doc, notes)
    curve_rows = curve_metrics(arms, baseline)
    final_section(doc, arms, confidence, target, name, caveat, curve_rows, threshold_note(curve_rows, baseline))
    seeds_section(doc, arms, target, confidence)
    evaluation_section(doc, arms, confidence)
    if baseline is not None:
        comparison_section(doc, arms, baseline, confidence, caveat, configs, margin, target_mde)
        budget_section(doc, arms, baseline, confidence, target, margin, matched)
    health_section(doc, arms)
    completions_section(doc, arms)
    curves_section(doc, arms, target, caveat, baseline, confidence)
    method_section(doc, confidence, margin, target_mde)
    provenance_section(doc, records, provenance, finished)

    (target / "report.md").write_text(render_markdown(doc))
    (target / "report.html").write_text(render_html(doc, f"Ablation report: {name}"))
    return target


def recorded_margin(meta: dict) -> float:
    """The equivalence margin a data folder was exported with (``EQUIVALENCE_MARGIN`` in one
    exported before the margin was kept)."""
    return _recorded_positive(meta, "equivalence_margin", EQUIVALENCE_MARGIN)


def recorded_target_mde(meta: dict) -> float:
    """The target MDE a data folder was exported with (``TARGET_MDE`` in one exported before the
    target was kept)."""
    return _recorded_positive(meta, "target_mde", TARGET_MDE)


def _recorded_positive(meta: dict, key: str, default: float) -> float:
    """``meta[key]`` (``default`` where absent), refused by name unless a positive finite number."""
    value = meta.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{key}: {value!r} in {DATA_MARKER} is no positive number; set one, e.g. {default}")
    return float(value)


def baseline_arm(arms: Sequence[Arm], cells: Sequence[CellInfo], chosen: str | None = None) -> Arm | None:
    """``chosen`` (the report's choice), else the arm the sweep named as its baseline (``baseline`` in
    cell.json; refused where the cells disagree), else the first arm."""
    by_name = {a.name: a for a in arms}
    if chosen is not None:
        if chosen not in by_name:
            raise ConfigError(f"baseline: no arm is named {chosen!r}; the arms are {sorted(by_name)}")
        return by_name[chosen]
    named = recorded_baseline(cells)
    return by_name[named] if named in by_name else (arms[0] if arms else None)


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
    return [arms[a] for a in sorted(arms, key=lambda a: arm_order(a, finished))]


def attach_outcomes(arms: Sequence[Arm]) -> str:
    """Give each arm the per-prompt outcomes of its runs' final validations (``outcomes.cell_outcomes``);
    where cells validated on other prompts, none, and the reason (the report then pairs by seed only)."""
    try:
        found = cell_outcomes([cell for arm in arms for cell in arm.cells])
    except ConfigError as error:
        return str(error)
    for arm in arms:
        arm.outcomes.update({cell.seed: found[cell.name] for cell in arm.cells if cell.name in found})
    return ""


def _noted(arms: Sequence[Arm], notes: Sequence[str]) -> list[str]:
    return [a.name for a in arms if any(n.startswith(f"**{user_text(a.name)}**") for n in notes)]


#: The order of the presets in tables and plots (the registry's); other arms follow by name.
VARIANT_ORDER = list(PRESETS)


def arm_order(arm: str, cells: Sequence[CellInfo]) -> tuple:
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
