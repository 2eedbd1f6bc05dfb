"""How many ablation cells one GPU should run at once: for each N, a sweep of N cells of one spec
started together (``parallel=N``, ``gpus=1``), each cell its own process with its share of the card's
memory; per cell the median seconds per optimizer step (``perf/step_s``, steps 2..), and for the wave
the wall time, the optimizer steps per second of the card, and the cells an hour that gives at the
spec's full length.

    python benchmarks/cells_per_gpu.py --cells 1 2 4 8 16 --steps 10 --spec smollm2_variants \\
        --out runs/cells_per_gpu [HYDRA_OVERRIDES ...]

Writes ``--out/results.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def step_seconds(cell_dir: Path) -> list[float]:
    """``perf/step_s`` of each optimizer step the cell logged, in order (the reader of event files that the report uses too)."""
    from grpo_lightning.ablation.runs import read_scalars

    series = read_scalars(cell_dir).get("perf/step_s")
    return [] if series is None else series.values.tolist()


def wave(cells: int, args: argparse.Namespace, extra: list[str]) -> dict:
    folder = args.out / f"cells{cells}"
    command = [sys.executable, "-m", "grpo_lightning.ablation.run", "--config-name", args.spec,
               f"variants=[{args.variant}]", f"seeds=[{','.join(str(s) for s in range(cells))}]", f"parallel={cells}",
               "gpus=1", "hydra/launcher=joblib", f"hydra.launcher.n_jobs={cells}", f"output_dir={folder}", f"args.trainer.max_steps={args.steps}",
               f"args.trainer.val_check_interval={args.steps}", "validate_before_training=false", *extra]  # fmt: skip
    start = time.perf_counter()
    finished = subprocess.run(command, check=False).returncode == 0
    wall = time.perf_counter() - start
    per_cell = [step_seconds(d) for d in sorted(folder.iterdir()) if (d / "DONE").exists()]
    medians = [statistics.median(s[1:]) for s in per_cell if len(s) > 1]
    step = statistics.median(medians) if medians else float("nan")
    return {"cells": cells, "finished": len(per_cell), "ok": finished, "wall_s": round(wall, 1),
            "cell_step_s_median": round(step, 3), "cell_step_s_range": [round(min(medians), 3), round(max(medians), 3)] if medians else None,
            "card_steps_per_s": round(cells / step, 2) if medians else None,
            "cells_per_hour_at_full_length": round(3600 * cells / (step * args.full_steps), 1) if medians else None}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps of each cell")
    parser.add_argument("--full-steps", type=int, default=40, help="a full cell's steps, for cells an hour")
    parser.add_argument("--spec", default="smollm2_variants")
    parser.add_argument("--variant", default="grpo")
    parser.add_argument("--out", type=Path, default=Path("runs/cells_per_gpu"))
    args, extra = parser.parse_known_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for cells in args.cells:
        rows.append(wave(cells, args, extra))
        print(json.dumps(rows[-1]), flush=True)
        (args.out / "results.json").write_text(json.dumps({"settings": vars(args) | {"out": str(args.out)}, "extra": extra,
                                                           "rows": rows}, indent=1) + "\n")  # fmt: skip
    print("| cells at once | s/step per cell (median, range) | card steps/s | cells/hour at full length | wave wall s |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['cells']} | {row['cell_step_s_median']} {row['cell_step_s_range']} | {row['card_steps_per_s']} | "
              f"{row['cells_per_hour_at_full_length']} | {row['wall_s']} |")


if __name__ == "__main__":
    main()
