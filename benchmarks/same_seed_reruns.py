"""The same cells (arm and seed) run twice, on other machines or cards: how far apart their final greedy
accuracies end, against how far the seeds of one arm spread.

    python benchmarks/same_seed_reruns.py FIRST SECOND [--spread DIR ...] > reruns.md

FIRST and SECOND are sweep folders or reports' ``data/`` folders; the cells finished in both are paired
by name. A rerun that only reorders floating-point sums (another card's kernels) is a new draw when its
own spread, ``sd(second - first) / sqrt(2)``, matches the spread between seeds (pooled over the arms of
``--spread``, default FIRST): then a seed fixes the data order and nothing else across machines, and the
mean difference says whether one machine trains better. Each value is checked against its outcomes
(``final_accuracy.final_only_run``).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from grpo_lightning.report.cells import discover_cells
from grpo_lightning.report.render.formatting import fmt
from grpo_lightning.report.statistics import seed_interval

sys.path.insert(0, str(Path(__file__).resolve().parent))
import final_accuracy  # noqa: E402  (benchmarks/final_accuracy.py: each value checked against its outcomes)


def finals(source: Path) -> dict[str, tuple[str, float]]:
    """Each finished cell of ``source`` by name: its arm and final val/accuracy."""
    out = {}
    for cell in discover_cells(source):
        if cell.finished:
            run = final_accuracy.final_only_run(cell.directory)
            out[cell.directory.name] = (cell.arm, float(run.scalars[final_accuracy.KEY].values[-1]))
    return out


def pooled_seed_sd(cells: dict[str, tuple[str, float]]) -> float:
    """The standard deviation between seeds within an arm, pooled over the arms (each by its degrees of freedom)."""
    by_arm: dict[str, list[float]] = defaultdict(list)
    for arm, value in cells.values():
        by_arm[arm].append(value)
    groups = [np.asarray(v) for v in by_arm.values() if len(v) > 1]
    dof = sum(len(v) - 1 for v in groups)
    return math.sqrt(sum(float(((v - v.mean()) ** 2).sum()) for v in groups) / dof) if dof else math.nan


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--spread", type=Path, nargs="+", default=None, help="folders whose seeds give the spread")
    args = parser.parse_args(argv)
    first, second = finals(args.first), finals(args.second)
    both = sorted(set(first) & set(second))
    if len(both) < 2:
        raise SystemExit(f"{len(both)} cell(s) finished in both folders: at least 2 are needed")
    spread_cells = {f"{i}/{k}": v for i, s in enumerate(args.spread or [args.first]) for k, v in finals(s).items()}
    differences = [second[name][1] - first[name][1] for name in both]
    mean, low, high = seed_interval(differences, 0.95)
    rerun_sd = float(np.std(differences, ddof=1)) / math.sqrt(2)
    seed_sd = pooled_seed_sd(spread_cells)
    print(f"# The same cells run twice: `{args.first}` then `{args.second}`\n")
    print("| cell | first | second | second - first |\n|---|---|---|---|")
    for name, d in zip(both, differences):
        print(f"| {name} | {fmt(first[name][1])} | {fmt(second[name][1])} | {d:+.3f} |")
    print(f"\n{len(both)} cells. Mean difference {mean:+.4f} [{low:+.4f}, {high:+.4f}] (95% t-interval over the "
          f"cells); standard deviation of the differences {np.std(differences, ddof=1):.4f}, so a rerun's own spread "
          f"is {rerun_sd:.4f}, against {seed_sd:.4f} between the seeds of an arm (pooled over the arms of "
          f"{len(spread_cells)} cells).")  # fmt: skip


if __name__ == "__main__":
    main()
