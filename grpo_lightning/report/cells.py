"""The cells of a sweep folder and the configurations they ran with."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lightning.errors import ConfigError
from grpo_lightning.ablation.join import check_same_settings, other_settings
from grpo_lightning.ablation.runs import event_directory, has_scalars, is_done


@dataclass
class CellInfo:
    directory: Path
    name: str
    arm: str
    variant: str
    seed: int | None
    overrides: dict[str, Any]
    finished: bool
    config: dict[str, Any]
    #: The arm the sweep compares the others with, as its cell.json records it.
    baseline: str | None = None
    #: The settings the cell ran with, as its cell.json records them (``SweepSpec.settings``); None in older records.
    settings: dict[str, Any] | None = None
    #: The code the cell started with, as its cell.json records it (``provenance.code_state``); None in older records.
    code: dict[str, Any] | None = None


#: The file that marks a report's ``data/`` folder (``report.data``): cells below one belong to
#: that report, not to the sweep folder that holds it.
DATA_MARKER = "sweep.json"


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def discover_cells(sweep_dir: Path) -> list[CellInfo]:
    """Cells of a sweep: folders with ``cell.json``, else folders with event files and a config."""
    sweep_dir = Path(sweep_dir)
    cells = []
    cell_files = [p for p in sorted(sweep_dir.rglob("cell.json")) if not _inside_data_folder(p, sweep_dir)]
    if cell_files:
        for path in cell_files:
            record = json.loads(path.read_text())
            directory = path.parent
            cells.append(
                CellInfo(
                    directory=directory,
                    name=str(record.get("name", directory.name)),
                    arm=str(record.get("arm", record.get("variant", directory.name))),
                    variant=str(record.get("variant", "")),
                    seed=record.get("seed"),
                    overrides=dict(record.get("overrides") or {}),
                    finished=is_done(directory),
                    config=_read_yaml(directory / "config.yaml"),
                    baseline=record.get("baseline"),
                    settings=record.get("settings") if isinstance(record.get("settings"), dict) else None,
                    code=record.get("code") if isinstance(record.get("code"), dict) else None,
                )
            )
    else:
        for config_path in sorted(sweep_dir.rglob("config.yaml")):
            directory = config_path.parent
            if _inside_data_folder(config_path, sweep_dir):
                continue
            if not any(directory.rglob("events.out.tfevents.*")):
                continue
            config = _read_yaml(config_path)
            model = config.get("model") or {}
            class_path = model.get("class_path", "") if isinstance(model, dict) else ""
            variant = class_path.rsplit(".", 1)[-1] or directory.name
            cells.append(
                CellInfo(directory, directory.relative_to(sweep_dir).as_posix(), variant, variant,
                         config.get("seed_everything"), {}, True, config)
            )  # fmt: skip
    cells.sort(key=lambda c: (c.arm, c.seed if isinstance(c.seed, int) else -1, c.name))
    refuse_duplicate_cells(cells)
    return cells


def refuse_duplicate_cells(cells: Sequence[CellInfo]) -> None:
    """Refuse two cells of one arm with the same seed: the seed would count twice in the arm's mean
    and its paired differences. Cells of an unknown seed (plain fit folders without one) are not checked."""
    seen: dict[tuple[str, Any], CellInfo] = {}
    for cell in cells:
        if cell.seed is None:
            continue
        first = seen.setdefault((cell.arm, cell.seed), cell)
        if first is not cell:
            raise ConfigError(
                f"seed: arm {cell.arm!r} has seed {cell.seed} twice, in {first.directory} and {cell.directory}; "
                "remove one of the two folders, or rerun the sweep into a fresh folder"
            )


def refuse_cells_without_scalars(cells: Sequence[CellInfo]) -> None:
    """Refuse finished cells kept without their step-wise scalars (a tarball that left out the event
    files), naming each: the curves, budgets and training metrics would silently count fewer seeds."""
    missing = [cell.name for cell in cells if cell.finished and not has_scalars(cell.directory)]
    if missing:
        raise ConfigError(f"report: {len(missing)} finished cell(s) hold no step-wise scalars (no scalars.csv.gz, no "
                          f"TensorBoard event files): {', '.join(missing)}; carry a sweep off its machine whole, or as the "
                          "data/ folder `grpo-lightning-report` writes, then build the report again")  # fmt: skip


def check_one_design(cells: Sequence[CellInfo]) -> None:
    """Refuse finished cells that ran with other shared settings (``args``, base configs, model, ...) than the first:
    an earlier sweep's cells left in the folder would be compared as one design (the check of ``ablation.join``)."""
    recorded = [cell for cell in cells if cell.finished and cell.settings is not None]
    if not recorded:
        return
    first = {"settings": recorded[0].settings}
    others = [cell for cell in recorded if other_settings(first, {"settings": cell.settings})]
    if others:
        check_same_settings(first, {"settings": others[0].settings}, "cell" + "s" * (len(others) > 1) + " "
                            + ", ".join(cell.name for cell in others), context="report",
                            advice=f"{recorded[0].name} and {len(recorded) - len(others) - 1} other finished cells ran "
                            "with the latter; a report compares one design: move one design's cell folders out (or run "
                            "the sweep into a fresh output_dir) and report each apart")  # fmt: skip


def recorded_baseline(cells: Sequence[CellInfo]) -> str | None:
    """The baseline arm the cells' cell.json record (None where none does); refused where they disagree."""
    by_baseline: dict[str, list[str]] = {}
    for cell in cells:
        if cell.baseline is not None:
            by_baseline.setdefault(str(cell.baseline), []).append(cell.name)
    if len(by_baseline) > 1:
        named = "; ".join(f"{b!r} by {', '.join(names)}" for b, names in sorted(by_baseline.items()))
        raise ConfigError(f"baseline: the cells record different baselines ({named}); choose one with --baseline NAME "
                          f"(for a report's data/ folder: \"baseline\": NAME in its {DATA_MARKER})")  # fmt: skip
    return next(iter(by_baseline), None)


def _inside_data_folder(path: Path, sweep_dir: Path) -> bool:
    """Whether ``path`` lies in a report's ``data/`` folder below ``sweep_dir``."""
    return any((parent / DATA_MARKER).is_file() for parent in path.parents if parent != sweep_dir and sweep_dir in parent.parents)


def log_file(directory: Path, name: str, exists: Callable[[Path], bool] = Path.is_file) -> Path | None:
    """The file ``name`` a run wrote beside its logs (a folder with ``exists=Path.is_dir``): in the
    cell folder, else in the folder of its TensorBoard event files; None when the run has none."""
    directory = Path(directory)
    if exists(directory / name):
        return directory / name
    try:
        events = event_directory(directory)
    except (FileNotFoundError, ValueError):
        return None
    return events / name if exists(events / name) else None


# ---------------------------------------------------------------------------- configuration tables

#: Settings that differ between the cells of one arm by construction.
PER_CELL_KEYS = ("seed_everything", "data.init_args.seed", "trainer.default_root_dir", "trainer.logger.init_args.save_dir")


def flatten_config(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a nested config; list items as ``key[i]``; leaves as compact YAML-ish text."""
    flat: dict[str, Any] = {}
    if isinstance(tree, Mapping):
        if not tree and prefix:
            flat[prefix] = "{}"
        for key in tree:
            flat.update(flatten_config(tree[key], f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(tree, list) and any(isinstance(v, (Mapping, list)) for v in tree):
        for i, value in enumerate(tree):
            flat.update(flatten_config(value, f"{prefix}[{i}]"))
    else:
        flat[prefix] = _config_text(tree)
    return flat


def _config_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_config_text(v) for v in value) + "]"
    if isinstance(value, str) and value == "":
        return "''"
    return str(value)


def arm_configs(cells: Sequence[CellInfo]) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """Per arm: the flattened config of its first cell, and keys that differ inside the arm."""
    by_arm: dict[str, list[CellInfo]] = {}
    for cell in cells:
        by_arm.setdefault(cell.arm, []).append(cell)
    configs, inconsistent = {}, {}
    for arm, members in by_arm.items():
        flats = [{k: v for k, v in flatten_config(c.config).items() if k not in PER_CELL_KEYS} for c in members if c.config]
        configs[arm] = flats[0] if flats else {}
        keys = sorted({k for f in flats for k in f})
        inconsistent[arm] = [k for k in keys if len({f.get(k, "\0") for f in flats}) > 1]
    return configs, inconsistent
