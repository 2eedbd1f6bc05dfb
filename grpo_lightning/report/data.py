"""The ``data/`` folder beside a report: everything the report reads, as small text files, so the
committed report can be rebuilt from the repository alone.

    data/sweep.json                  the report's title, the sweep folder's name, extra provenance lines,
                                     the equivalence margin, the target MDE, and the baseline arm
                                     where the report chose another than the sweep
    data/provenance.json             the sweep's provenance records (commit, and the diff of a dirty tree)
    data/<cell>/cell.json            the cell's identity and command (and the sweep's baseline arm)
    data/<cell>/scalars.csv.gz       every TensorBoard scalar (gzipped CSV): tag, step, value, wall time
    data/<cell>/config.yaml, metrics.json, health.json, DONE     as the sweep wrote them
    data/<cell>/completions.jsonl    the completions the report shows (first and last step)
    data/<cell>/outcomes/*.csv.gz    each validation's per-prompt outcomes (grpo_lightning.evaluation.outcomes),
                                     for runs that wrote them; read by report.outcomes.cell_outcomes

``REGENERATE`` beside the report holds one shell line, run from the repository root, that
rebuilds the report from ``data/`` into the folder named by ``$OUT``. A report is always built
from its ``data/`` folder, the first time too, so the rebuilt files are the same bytes.
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpo_lightning.report.cells import DATA_MARKER, CellInfo, log_file
from grpo_lightning.report.outcomes import copy_outcomes
from grpo_lightning.report.sections.completions import COMPLETIONS_FILE, first_and_last
from grpo_lightning.report.sections.health import HEALTH_FILE
from grpo_lightning.report.sections.provenance import PROVENANCE_FILE
from grpo_lightning.ablation.runs import DONE_FILE, SCALARS_FILE, event_directory, read_scalars, write_scalars_csv

DATA_FOLDER = "data"
REGENERATE_FILE = "REGENERATE"
#: Files of a cell folder copied as they are.
CELL_FILES = ("cell.json", "config.yaml", "metrics.json", DONE_FILE)


def is_data_folder(path: Path) -> bool:
    return (Path(path) / DATA_MARKER).is_file()


def read_sweep_record(data_dir: Path) -> dict[str, Any]:
    """``sweep.json`` of a data folder (empty where it cannot be read)."""
    try:
        record = json.loads((Path(data_dir) / DATA_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def export_data(sweep_dir: Path, cells: Sequence[CellInfo], data_dir: Path, name: str, provenance: Sequence[str],
                baseline: str | None = None, equivalence_margin: float | None = None,
                target_mde: float | None = None) -> None:  # fmt: skip
    """Write the data folder of ``cells`` (replacing an earlier one) from ``sweep_dir``; ``baseline``:
    the arm the report compares with, in place of the one the sweep named; ``equivalence_margin``:
    the margin of the report's equivalence verdicts; ``target_mde``: the MDE it gives the seeds for."""
    sweep_dir, data_dir = Path(sweep_dir), Path(data_dir)
    if data_dir.exists():
        if not is_data_folder(data_dir) and any(data_dir.iterdir()):
            raise FileExistsError(f"{data_dir} exists and is not a report's data folder: move it away or pick another --output")
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True)
    for cell in cells:
        _export_cell(cell, data_dir / cell.name)
    if (sweep_dir / PROVENANCE_FILE).is_file():
        shutil.copyfile(sweep_dir / PROVENANCE_FILE, data_dir / PROVENANCE_FILE)
    record = {"name": name, "sweep_folder": sweep_dir.resolve().name, "provenance": list(provenance)}
    if baseline is not None:
        record["baseline"] = baseline
    if equivalence_margin is not None:
        record["equivalence_margin"] = equivalence_margin
    if target_mde is not None:
        record["target_mde"] = target_mde
    (data_dir / DATA_MARKER).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def _export_cell(cell: CellInfo, target: Path) -> None:
    target.mkdir(parents=True)
    for name in CELL_FILES:
        if (cell.directory / name).is_file():
            shutil.copyfile(cell.directory / name, target / name)
    if not (target / "cell.json").is_file():  # a plain fit directory: its identity as discover_cells read it
        record = {"name": cell.name, "arm": cell.arm, "variant": cell.variant, "seed": cell.seed, "overrides": cell.overrides}
        (target / "cell.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        (target / DONE_FILE).write_text("")
    try:
        write_scalars_csv(read_scalars(event_directory(cell.directory)), target / SCALARS_FILE)
    except FileNotFoundError:  # no event files: a cell restored from a data folder, or one that logged nothing
        if (cell.directory / SCALARS_FILE).is_file():
            shutil.copyfile(cell.directory / SCALARS_FILE, target / SCALARS_FILE)
    health = log_file(cell.directory, HEALTH_FILE)
    if health is not None:
        shutil.copyfile(health, target / HEALTH_FILE)
    completions = log_file(cell.directory, COMPLETIONS_FILE)
    if completions is not None:
        shown = first_and_last(completions)
        (target / COMPLETIONS_FILE).write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in shown))
    copy_outcomes(cell.directory, target)


def regenerate_line(data_dir: Path, confidence: float) -> str:
    """The shell line that rebuilds the report from ``data_dir`` into ``$OUT``: the data folder
    relative to the working directory (the repository root for a committed report)."""
    data_dir = Path(data_dir).absolute()
    try:
        shown = data_dir.relative_to(Path.cwd().absolute()).as_posix()
    except ValueError:
        shown = data_dir.as_posix()
    extra = f" --confidence {confidence:g}" if confidence != 0.95 else ""
    return f'grpo-lightning-report {shlex.quote(shown)} --output "$OUT"{extra}\n'
