"""The Health section: the checks each run wrote to ``health.json`` (a list of
``{"check", "ok", "steps", "first_step", "detail"}``), as a table of check x arm with the number
of seeds that flagged each check. Runs without the file add no rows."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_lightning.report.arms import Arm
from grpo_lightning.report.cells import log_file
from grpo_lightning.report.render.document import Doc, user_text

HEALTH_FILE = "health.json"


def read_health(directory: Path) -> list[dict[str, Any]] | None:
    """The entries of a run's ``health.json`` (None without the file or when it is not a list)."""
    path = log_file(directory, HEALTH_FILE)
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, list):
        return None
    return [entry for entry in data if isinstance(entry, Mapping) and "check" in entry]


def flag_text(entries: Sequence[Mapping[str, Any] | None]) -> str:
    """``"1 of 3 (from step 14)"``: seeds whose entry is not ok, of the seeds that ran the check."""
    ran = [e for e in entries if e is not None]
    if not ran:
        return "—"
    flagged = [e for e in ran if not e.get("ok", True)]
    firsts = [e["first_step"] for e in flagged if isinstance(e.get("first_step"), int)]
    return f"{len(flagged)} of {len(ran)}" + (f" (from step {min(firsts)})" if firsts else "")


def health_section(doc: Doc, arms: Sequence[Arm]) -> None:
    per_run = {cell.name: read_health(cell.directory) for arm in arms for cell in arm.cells}
    if all(entries is None for entries in per_run.values()):
        return
    by_check: dict[str, dict[str, list]] = {}
    for arm in arms:
        for cell in arm.cells:
            for entry in per_run[cell.name] or []:
                by_check.setdefault(str(entry["check"]), {}).setdefault(arm.name, []).append(entry)
    doc.h(2, "Health")
    doc.p("Checks of each run's `health.json`: how many seeds flagged a check (of the seeds that ran it), "
          "and the first step at which one did.")  # fmt: skip
    rows = [[f"`{check}`", *(flag_text(found.get(arm.name, [])) for arm in arms)] for check, found in sorted(by_check.items())]
    doc.table(["check", *(user_text(a.name) for a in arms)], rows, "l" + "r" * len(arms))
    flagged = [
        f"`{user_text(cell)}`: `{entry['check']}`, {entry.get('steps', '?')} steps from step {entry.get('first_step', '?')}: {entry.get('detail', '')}"
        for cell, entries in per_run.items() for entry in entries or [] if not entry.get("ok", True)
    ]  # fmt: skip
    if flagged:
        body = Doc()
        body.items(flagged)
        doc.details(f"Flagged checks ({len(flagged)})", body)
