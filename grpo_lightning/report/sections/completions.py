"""The Completions section: a few completions of each arm's first seed, from the first and the
last step of its ``completions.jsonl`` (one JSON object per completion: ``step``, ``group``,
``prompt``, ``completion``, ``rewards``, ``reward``, ``advantage``, ``truncated``)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from grpo_lightning.report.arms import Arm
from grpo_lightning.report.cells import log_file
from grpo_lightning.report.render.document import Doc, user_text
from grpo_lightning.report.render.formatting import code_text, fmt

COMPLETIONS_FILE = "completions.jsonl"
#: Completions shown per step, and the characters kept of each prompt and completion.
PER_STEP = 3
PROMPT_CHARS = 80
COMPLETION_CHARS = 160


def _records(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                yield record


def first_and_last(path: Path, per_step: int = PER_STEP) -> list[dict[str, Any]]:
    """The first ``per_step`` records of the lowest and of the highest step in the file."""
    first: list[dict[str, Any]] = []
    last: list[dict[str, Any]] = []
    for record in _records(path):
        step = record["step"]
        if not first or step < first[0]["step"]:
            first = [record]
        elif step == first[0]["step"] and len(first) < per_step:
            first.append(record)
        if not last or step > last[0]["step"]:
            last = [record]
        elif step == last[0]["step"] and len(last) < per_step:
            last.append(record)
    return first if not last or last[0]["step"] == first[0]["step"] else first + last


def completion_row(record: dict[str, Any]) -> list[str]:
    completion = code_text(record.get("completion", ""), COMPLETION_CHARS)
    if record.get("truncated"):
        completion += " (truncated)"
    return [str(record["step"]), code_text(record.get("prompt", ""), PROMPT_CHARS), completion,
            _number(record.get("reward")), _number(record.get("advantage"))]  # fmt: skip


def _number(value: Any) -> str:
    return fmt(float(value)) if isinstance(value, (int, float)) else "n/a"


def first_seed_file(arm: Arm) -> tuple[str, Path] | None:
    """The completions file of the arm's lowest seed that wrote one."""
    cells = sorted(arm.cells, key=lambda c: (c.seed if isinstance(c.seed, int) else 1 << 30, c.name))
    for cell in cells:
        path = log_file(cell.directory, COMPLETIONS_FILE)
        if path is not None:
            return cell.name, path
    return None


def completions_section(doc: Doc, arms: Sequence[Arm]) -> None:
    found = [(arm, first_seed_file(arm)) for arm in arms]
    found = [(arm, hit) for arm, hit in found if hit is not None]
    if not found:
        return
    doc.h(2, "Completions")
    doc.p(f"Up to {PER_STEP} completions of the first and of the last step in each arm's `{COMPLETIONS_FILE}` "
          "(its first seed), shortened in the middle; ⏎ marks a line break.")  # fmt: skip
    for arm, (run_name, path) in found:
        rows = [completion_row(record) for record in first_and_last(path)]
        doc.h(3, user_text(arm.name))
        if rows:
            doc.table(["step", "prompt", "completion", "reward", "advantage"], rows, "rllrr")
        else:
            doc.p(f"`{user_text(run_name)}`: no completions in `{COMPLETIONS_FILE}`.")
