"""Learning-curve PNGs: the mean over seeds with a band of one standard deviation, against
training steps, generated tokens and wall-clock seconds."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from grpo_lightning.report.runs import Run

if TYPE_CHECKING:
    from grpo_lightning.report.arms import Arm

#: The columns of every curve figure: the x axis and its label.
AXES = [("step", "training step"), ("tokens", "generated tokens"), ("time", "wall-clock seconds")]


def aligned_curve(runs: Sequence[Run], tag: str, axis: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Mean and standard deviation over runs of ``tag`` on a common grid of ``axis``.

    The grid is every x any run logged inside the range all runs cover; each run is linearly
    interpolated onto it (runs that logged the same steps are used as they are). Returns
    ``(x, mean, std, n_runs)``.
    """
    curves = [run.axis(tag, axis) for run in runs]
    curves = [_sorted_unique(x, y) for x, y in curves if len(x)]
    empty = np.array([])
    if not curves:
        return empty, empty, empty, 0
    low = max(float(x[0]) for x, _ in curves)
    high = min(float(x[-1]) for x, _ in curves)
    if high < low:
        return empty, empty, empty, 0
    grid = np.unique(np.concatenate([x[(x >= low) & (x <= high)] for x, _ in curves]))
    stacked = np.stack([np.interp(grid, x, y) for x, y in curves])
    std = stacked.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros(len(grid))
    return grid, stacked.mean(axis=0), std, len(curves)


def _sorted_unique(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    keep = np.append(x[1:] != x[:-1], True)  # the last value logged at each x
    return x[keep], y[keep]


PNG_METADATA = {"Software": None, "Title": None, "Author": None, "Description": None, "Creation Time": None}


def plot_curves(arms: Sequence[Arm], tags: Sequence[str], title: str, path: Path) -> None:
    """One row per tag, one column per x axis; deterministic PNG bytes."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    rc = {"figure.dpi": 100, "savefig.dpi": 100, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3,
          "path.simplify": False, "svg.hashsalt": "grpo-lightning"}  # fmt: skip
    palette = "tab10" if len(arms) <= 10 else "tab20"
    colors = [matplotlib.colormaps[palette](i % 20) for i in range(len(arms))]
    with matplotlib.rc_context(rc):
        fig, axes = plt.subplots(len(tags), len(AXES), figsize=(13, 3.4 * len(tags)), squeeze=False)
        for row, tag in enumerate(tags):
            for col, (axis, label) in enumerate(AXES):
                ax = axes[row][col]
                drawn = False
                for arm, color in zip(arms, colors):
                    x, mean, std, n = aligned_curve(arm.runs, tag, axis)
                    if not len(x):
                        continue
                    drawn = True
                    marker = "o" if axis == "step" and len(x) <= 30 else None
                    ax.plot(x, mean, color=color, label=f"{arm.name} (n={n})", marker=marker, markersize=3, linewidth=1.4)
                    if n > 1:
                        ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.18, linewidth=0)
                if not drawn:
                    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
                ax.set_xlabel(label)
                ax.set_ylabel(tag)
                if row == 0 and col == 0 and drawn:
                    ax.legend(fontsize=8, loc="best")
        fig.suptitle(title)
        height = 3.4 * len(tags)
        fig.subplots_adjust(left=0.06, right=0.99, wspace=0.25, hspace=0.4, top=1 - 0.45 / height, bottom=0.55 / height)
        fig.savefig(path, format="png", metadata=PNG_METADATA)
        plt.close(fig)
    _palettize(path)


def _palettize(path: Path) -> None:
    """Rewrite a PNG with a 256-colour palette: a third of the bytes, the same picture to the eye.

    Deterministic (median-cut quantisation, no dithering), so reports stay byte-identical.
    """
    from PIL import Image

    with Image.open(path) as image:
        quantized = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    quantized.save(path, format="PNG", optimize=True)
