"""``metrics.json`` of a finished cell: the last value of every scalar and a few totals."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def summarize_cell(cell_dir: Path, wall_time_s: float | None = None) -> dict[str, Any]:
    """``metrics.json`` of a finished cell: the last value of every scalar and a few totals."""
    from grpo_lightning.ablation.runs import load_run

    run = load_run(cell_dir)
    final = {tag: series.values[-1] for tag, series in sorted(run.scalars.items()) if len(series.values)}
    summary: dict[str, Any] = {
        "final": {k: _finite(v) for k, v in final.items()},
        "final_step": {tag: int(series.steps[-1]) for tag, series in sorted(run.scalars.items()) if len(series.steps)},
        "val/accuracy_before": _finite(run.initial.get("val/accuracy")),
        "generated_tokens": _finite(final.get("perf/generated_tokens")),
        "training_flops": _finite(final.get("perf/flops")),  # None in runs recorded before it was logged
        "optimizer_steps": _finite(run.optimizer_steps()),
        "rollouts": _finite(final.get("counters/rollouts")),
        "generation_batches": _finite(run.generation_batches()),
        "train_time_s": _finite(run.train_time_s),
        "wall_time_s": None if wall_time_s is None else round(wall_time_s, 3),
    }
    return summary


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None
