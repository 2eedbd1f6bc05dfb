"""Each arm's class, read from the configuration its cells resolved (``config.yaml``), against the
variant its cells are named for: a report of mislabelled runs would compare the wrong things."""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path

from grpo_lightning.report.cells import CellInfo


class MislabelledArmError(ValueError):
    """A cell ran another class than the variant its arm is named for."""


def resolved_class(cell: CellInfo) -> str | None:
    """The ``model.class_path`` of the cell's resolved configuration, if it saved one."""
    model = cell.config.get("model") if cell.config else None
    if isinstance(model, str):
        return model
    return str(model["class_path"]) if isinstance(model, dict) and model.get("class_path") else None


def named_class(cell: CellInfo) -> str | None:
    """The class of the variant the cell is named for: its variant's YAML file, where it can be found
    (a shipped variant, a path that still exists, or the file its ``cell.json`` recorded)."""
    from grpo_lightning.ablation.labels import variant_class
    from grpo_lightning.ablation.spec import SweepError

    try:
        return variant_class(cell.variant)
    except SweepError:
        pass
    try:
        recorded = json.loads((Path(cell.directory) / "cell.json").read_text())["settings"]["variant_config"]
        return variant_class(str(recorded)) if Path(recorded).is_file() else None
    except (OSError, ValueError, KeyError, TypeError, SweepError):
        return None


def check_arm_classes(cells: Sequence[CellInfo]) -> None:
    """Refuse a cell whose resolved class is not its variant's; warn where either is unknown."""
    from grpo_lightning.ablation.labels import same_class

    unknown = []
    for cell in cells:
        if not cell.variant or not cell.finished:
            continue
        got, expected = resolved_class(cell), named_class(cell)
        if got is None or expected is None:
            unknown.append(cell.name)
            continue
        if got.rpartition(".")[2] != expected.rpartition(".")[2] or not same_class(got, expected):
            raise MislabelledArmError(
                f"{cell.directory}: the cell of arm {cell.arm!r} ran {got} (its config.yaml), not {expected} as its "
                f"variant {cell.variant!r} says; run the sweep again without a base config that sets model.class_path."
            )
    if unknown:
        warnings.warn(f"the class of cells {unknown} could not be checked against their variant (no config.yaml or "
                      "variant file)", stacklevel=2)  # fmt: skip
