"""Join the cells of several runs of one sweep (more seeds on another day, another machine) into one folder
that ``grpo-lightning-report`` reads as a single sweep::

    python -m grpo_lightning.ablation.join --out runs/joined runs/sweep_day1 runs/sweep_day2 [--name NAME] [--provenance LINE]

Each source is a sweep's ``output_dir`` or a report's ``data/`` folder. The join refuses what would make
the report silently wrong: the same cell (arm and seed) in two sources (unless one of them is
unfinished: the finished run is taken, and a line of ``sweep.json`` says so), a finished cell without its
step-wise scalars, and cells run with other settings than the first source's (the spec's shared ``args``,
base configs, model and warm start for every cell; an arm's whole settings, its overrides included, for
its cells). The sources' ``provenance.json`` records are concatenated, so
the report names every run's commit, card and command, and warns where the commits differ; the lines of
their ``sweep.json`` are kept in order.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_lightning.ablation.provenance import PROVENANCE_FILE
from grpo_lightning.ablation.runs import has_scalars, is_done
from grpo_lightning.errors import ConfigError

#: What every cell of a sweep shares, whatever its variant (cell.json's ``settings``).
SHARED_SETTINGS = ("args", "base_configs", "base_configs_sha256", "model", "validate_before_training", "warmstart")
#: Settings that cells recorded only from a version on: compared where both cells hold them.
LATER_SETTINGS = ("base_configs_sha256", "variant_config_sha256")
CELL_FILE = "cell.json"
SWEEP_FILE = "sweep.json"


def cells_of(source: Path) -> dict[str, dict[str, Any]]:
    """Each cell folder of ``source`` (one holding ``cell.json``) by name, with its ``cell.json``."""
    return {d.name: json.loads((d / CELL_FILE).read_text()) for d in sorted(source.iterdir()) if (d / CELL_FILE).is_file()}


def provenance_records(source: Path) -> list[dict[str, Any]]:
    """The records of ``source``'s ``provenance.json`` (a list, or one record); none without it."""
    path = source / PROVENANCE_FILE
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    return [data] if isinstance(data, dict) else list(data)


def portable(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with its config files named from their ``configs/`` folder on, as every checkout names them
    (a cell records the path it read: ``/work/repo/configs/x.yaml`` and ``configs/x.yaml`` are one file)."""

    def name(path: Any) -> Any:
        return "configs/" + path.rsplit("/configs/", 1)[1] if isinstance(path, str) and "/configs/" in path else path

    return {**settings, "base_configs": [name(p) for p in settings.get("base_configs") or []],
            "variant_config": name(settings.get("variant_config"))}  # fmt: skip


def comparable(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two cells' settings, :func:`portable`, without the :data:`LATER_SETTINGS` that either lacks (a cell
    recorded before it; its config files are then compared by path alone)."""
    ours, theirs = portable(ours), portable(theirs)
    for key in LATER_SETTINGS:
        if key not in ours or key not in theirs:
            ours.pop(key, None)
            theirs.pop(key, None)
    return ours, theirs


def other_settings(reference: Mapping[str, Any], cell: Mapping[str, Any]) -> list[str]:
    """The shared settings (``SHARED_SETTINGS``) in which ``cell`` differs from ``reference`` (both ``cell.json`` contents)."""
    ours, theirs = comparable(cell["settings"], reference["settings"])
    return [key for key in SHARED_SETTINGS if ours.get(key) != theirs.get(key)]


def check_same_settings(reference: Mapping[str, Any], cell: Mapping[str, Any], where: str, context: str = "join",
                        advice: str = "a joined sweep must be one design: report it apart") -> None:  # fmt: skip
    """Refuse ``cell`` whose shared settings differ from ``reference``'s (both ``cell.json`` contents), in an error
    that starts with ``context`` (the command) and ends with ``advice``; the join's and the report's check."""
    differing = other_settings(reference, cell)
    if differing:
        key = differing[0]
        ours, theirs = (settings.get(key) for settings in comparable(cell["settings"], reference["settings"]))
        raise ConfigError(f"{context}: {where} ran with other settings ({key}: {ours!r}, not {theirs!r}); {advice}")


def join(sources: Sequence[Path], out: Path, sweep_name: str | None = None, provenance: Sequence[str] = (),
         baseline: str | None = None) -> dict[str, Path]:  # fmt: skip
    """Copy the cells of ``sources`` into ``out`` (new or empty) with their provenance; returns each cell's source.
    ``sweep_name``: the joined sweep's name (the report's title; default the sources' names); ``provenance``: lines added
    to its ``sweep.json`` (the report's Provenance section), so that a report rebuilt from ``out`` keeps both.
    ``baseline``: the arm the report compares with, written to ``sweep.json``; needed where the sources' cells record
    different ones (a sweep of one arm's extra seeds records that arm)."""
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"join: --out {out} is not empty; give a new folder")
    found: dict[str, Path] = {}
    chosen: dict[str, Mapping[str, Any]] = {}  # the cell.json of each cell kept
    replaced: list[str] = []  # unfinished cells left out for a finished run of the same cell (said in sweep.json)
    first: dict[str, Any] | None = None
    by_arm: dict[str, Mapping[str, Any]] = {}
    for source in sources:
        if not source.is_dir():
            raise ConfigError(f"join: {source} is not a folder; give a sweep's output_dir or a report's data/ folder")
        cells = cells_of(source)
        if not cells:
            raise ConfigError(f"join: {source} holds no cell (no folder with a {CELL_FILE}); give a sweep's output_dir "
                              "or a report's data/ folder")  # fmt: skip
        for name, cell in cells.items():
            where = f"cell {name} of {source}"
            if name in found:
                finished = [is_done(folder / name) for folder in (found[name], source)]
                if finished[0] == finished[1]:
                    raise ConfigError(f"join: {where} is also in {found[name]}: the same arm and seed twice; drop one of them")
                if finished[0]:  # a run stopped before it finished the cell another run finished: the finished one
                    replaced.append(f"join: {name} of {source}, unfinished there, left out for its finished run in {found[name]}")
                    continue
                replaced.append(f"join: {name} of {found[name]}, unfinished there, left out for its finished run in {source}")
            first = first or cell
            check_same_settings(first, cell, where)
            arm = by_arm.setdefault(arm_of(name, cell), cell)
            arm_settings, cell_settings = comparable(arm["settings"], cell["settings"])
            if arm_settings != cell_settings:
                raise ConfigError(f"join: {where} ran its arm with other settings than the cells of that arm before it; "
                                  "a joined sweep must be one design: report it apart")  # fmt: skip
            found[name], chosen[name] = source, cell
    bare = [f"{name} of {source}" for name, source in found.items() if is_done(source / name)
            and not has_scalars(source / name)]  # fmt: skip
    if bare:
        raise ConfigError(f"join: {len(bare)} finished cell(s) hold no step-wise scalars (no scalars.csv.gz, no TensorBoard "
                          f"event files), which the report needs: {'; '.join(bare)}; join the sweep folders themselves, or "
                          "the data/ folders `grpo-lightning-report` writes of them")  # fmt: skip
    check_baseline(baseline, chosen)
    sweep = join_sweep_files([source / SWEEP_FILE for source in sources if (source / SWEEP_FILE).is_file()])
    if baseline is not None:
        sweep["baseline"] = baseline
    if sweep_name:
        sweep["name"] = sweep_name
    if provenance or replaced:
        sweep["provenance"] = [*sweep.get("provenance", []), *provenance, *replaced]
    records = [record for source in sources for record in provenance_records(source)]
    out.mkdir(parents=True, exist_ok=True)
    for name, source in found.items():
        shutil.copytree(source / name, out / name)
    (out / PROVENANCE_FILE).write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    if sweep:
        (out / SWEEP_FILE).write_text(json.dumps(sweep, indent=4, sort_keys=True))
    return found


def arm_of(name: str, cell: Mapping[str, Any]) -> str:
    """The arm a cell's ``cell.json`` names (older records: its variant; else the cell's folder name)."""
    return str(cell.get("arm") or cell.get("variant") or name)


def check_baseline(baseline: str | None, cells: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse a ``baseline`` that is no arm of ``cells``, and cells that record different baselines with none given."""
    arms = sorted({arm_of(name, cell) for name, cell in cells.items()})
    if baseline is not None:
        if baseline not in arms:
            raise ConfigError(f"join: --baseline {baseline!r} is not an arm of the joined cells; give one of {arms}")
        return
    recorded = sorted({str(cell["baseline"]) for cell in cells.values() if cell.get("baseline") is not None})
    if len(recorded) > 1:
        raise ConfigError(f"join: the cells record different baselines ({', '.join(recorded)}: a sweep of some arms' "
                          "extra seeds records its own first arm); give the report's with --baseline NAME")  # fmt: skip


#: ``sweep.json`` keys that name a source rather than set the report: sources from other folders join.
LABELS = ("name", "sweep_folder")


def join_sweep_files(paths: Sequence[Path]) -> dict[str, Any]:
    """The sources' ``sweep.json`` as one: the same settings in each (else refused), their provenance lines in order,
    and their labels (``LABELS``: the sweep's name and folder) joined with `` + `` where they differ."""
    joined: dict[str, Any] = {}
    lines: list[str] = []
    labels: dict[str, list[str]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        lines += [line for line in data.pop("provenance", []) if line not in lines]
        for key in LABELS:
            if key in data and str(data[key]) not in labels.setdefault(key, []):
                labels[key].append(str(data.pop(key)))
            data.pop(key, None)
        for key, value in data.items():
            if joined.setdefault(key, value) != value:
                raise ConfigError(f"join: {path} sets {key} to {value!r}, another source to {joined[key]!r}; make them "
                                  "agree (they are the report's settings) or report the runs apart")  # fmt: skip
    joined.update({key: " + ".join(values) for key, values in labels.items() if values})
    return {**joined, "provenance": lines} if joined or lines else {}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", type=Path, nargs="+", help="sweep output_dirs or reports' data/ folders")
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the joined cells")
    parser.add_argument("--name", default=None, help="the joined sweep's name, the report's title (default: the sources')")
    parser.add_argument("--provenance", action="append", default=[], metavar="LINE",
                        help="a line for the report's Provenance section (the command, card and commit); repeatable")
    parser.add_argument("--baseline", default=None, metavar="ARM",
                        help="the arm the report compares with (needed where the sources' cells record different ones)")
    args = parser.parse_args(argv)
    try:
        found = join(args.sources, args.out, args.name, args.provenance, args.baseline)
    except ConfigError as error:
        parser.exit(2, f"error: {error}\n")
    for source in args.sources:
        print(f"{source}: {sum(s == source for s in found.values())} cells")
    print(f"{len(found)} cells in {args.out}")


if __name__ == "__main__":
    main()
