"""How many ablation cells one GPU should run at once: for each N, a sweep of N cells of one spec
started together (``parallel=N``, ``gpus=1``), each cell its own process with its share of the card's
memory; per cell the median seconds per optimizer step (``perf/step_s``, steps 2..), and for the wave
the wall time, the optimizer steps per second of the card, and the cells an hour that gives at the
spec's full length.

    python benchmarks/cells_per_gpu.py --cells 1 2 4 8 16 --steps 10 --spec smollm2_variants \\
        --out runs/cells_per_gpu [HYDRA_OVERRIDES ...]

``--mps off on`` runs every N twice, without and then with NVIDIA's Multi-Process Service (a control
daemon started for the wave, its pipe and log folders under ``--out``, stopped after it): without it the
card time-slices between the cells' processes, one process's kernels at a time; with it their kernels
run side by side. Needs ``nvidia-cuda-mps-control`` on the PATH and the card in its default compute mode.

Writes ``--out/results.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

#: The environment that points a CUDA process at an MPS control daemon.
MPS_VARIABLES = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


@contextlib.contextmanager
def mps_daemon(folder: Path) -> Iterator[dict[str, str]]:
    """NVIDIA's Multi-Process Service for the processes started inside with the environment it yields: its
    control daemon runs with its pipe and log folders under ``folder`` and is told to quit on the way out."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        raise SystemExit("--mps on: nvidia-cuda-mps-control is not on the PATH (it ships with the NVIDIA driver); "
                         "run with --mps off")  # fmt: skip
    env = dict(os.environ)
    for name, path in zip(MPS_VARIABLES, (folder / "mps_pipe", folder / "mps_log")):
        path.mkdir(parents=True, exist_ok=True)
        env[name] = str(path)
    subprocess.run([control, "-d"], env=env, check=True)
    try:
        yield env
    finally:
        subprocess.run([control], input="quit\n", text=True, env=env, check=False)


def step_seconds(cell_dir: Path) -> list[float]:
    """``perf/step_s`` of each optimizer step the cell logged, in order (the reader of event files that the report uses too)."""
    from grpo_lightning.ablation.runs import read_scalars

    series = read_scalars(cell_dir).get("perf/step_s")
    return [] if series is None else series.values.tolist()


def wave(cells: int, args: argparse.Namespace, extra: list[str], mps: bool = False) -> dict:
    folder = args.out / f"cells{cells}{'_mps' if mps else ''}"
    command = [sys.executable, "-m", "grpo_lightning.ablation.run", "--config-name", args.spec,
               f"variants=[{args.variant}]", f"seeds=[{','.join(str(s) for s in range(cells))}]", f"parallel={cells}",
               "gpus=1", "hydra/launcher=joblib", f"hydra.launcher.n_jobs={cells}", f"output_dir={folder}", f"args.trainer.max_steps={args.steps}",
               f"args.trainer.val_check_interval={args.steps}", "validate_before_training=false", *extra]  # fmt: skip
    start = time.perf_counter()
    with mps_daemon(folder) if mps else contextlib.nullcontext() as env:
        finished = subprocess.run(command, env=env, check=False).returncode == 0
    wall = time.perf_counter() - start
    per_cell = [step_seconds(d) for d in sorted(folder.iterdir()) if (d / "DONE").exists()]
    medians = [statistics.median(s[1:]) for s in per_cell if len(s) > 1]
    step = statistics.median(medians) if medians else float("nan")
    return {"cells": cells, "mps": mps, "finished": len(per_cell), "ok": finished, "wall_s": round(wall, 1),
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
    parser.add_argument("--mps", nargs="+", choices=["off", "on"], default=["off"],
                        help="without and/or with NVIDIA's Multi-Process Service, each N in turn")
    parser.add_argument("--out", type=Path, default=Path("runs/cells_per_gpu"))
    args, extra = parser.parse_known_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for cells in args.cells:
        for mps in args.mps:
            rows.append(wave(cells, args, extra, mps=mps == "on"))
            print(json.dumps(rows[-1]), flush=True)
        (args.out / "results.json").write_text(json.dumps({"settings": vars(args) | {"out": str(args.out)}, "extra": extra,
                                                           "rows": rows}, indent=1) + "\n")  # fmt: skip
    print("| cells at once | MPS | s/step per cell (median, range) | card steps/s | cells/hour at full length | wave wall s |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['cells']} | {'on' if row['mps'] else 'off'} | {row['cell_step_s_median']} {row['cell_step_s_range']} | {row['card_steps_per_s']} | "
              f"{row['cells_per_hour_at_full_length']} | {row['wall_s']} |")


if __name__ == "__main__":
    main()
