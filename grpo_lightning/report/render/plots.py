"""Learning-curve PNGs: each seed as a thin line under the mean over seeds and the band of its
Student-t interval (``statistics.seed_interval``), against training steps, generated tokens and
wall-clock seconds; one colour per arm and one y-range per curve across the figures of a report.
And the figure of a final metric: each seed a dot beside its arm's mean, interval and median."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from grpo_lightning.ablation.runs import Run
from grpo_lightning.report.statistics import seed_interval

if TYPE_CHECKING:
    from grpo_lightning.report.arms import Arm

#: The columns of every curve figure: the x axis and its label.
AXES = [("step", "training step"), ("tokens", "generated tokens"), ("flops", "training FLOPs (2N per token pass)"),
        ("time", "wall-clock seconds")]  # fmt: skip


def aligned_seeds(runs: Sequence[Run], tag: str, axis: str) -> tuple[np.ndarray, np.ndarray]:
    """``tag`` of every run with data on a common grid of ``axis``: ``(x, values [runs, x])``.

    The grid is every x any run logged inside the range all runs cover; each run is linearly
    interpolated onto it (runs that logged the same steps are used as they are).
    """
    curves = [run.axis(tag, axis) for run in runs]
    curves = [_sorted_unique(x, y) for x, y in curves if len(x)]
    empty = np.array([])
    if not curves:
        return empty, np.empty((0, 0))
    low = max(float(x[0]) for x, _ in curves)
    high = min(float(x[-1]) for x, _ in curves)
    if high < low:
        return empty, np.empty((0, 0))
    grid = np.unique(np.concatenate([x[(x >= low) & (x <= high)] for x, _ in curves]))
    return grid, np.stack([np.interp(grid, x, y) for x, y in curves])


def aligned_curve(runs: Sequence[Run], tag: str, axis: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Mean and standard deviation over runs of ``tag`` on the grid of ``aligned_seeds``:
    ``(x, mean, std, n_runs)``."""
    grid, stacked = aligned_seeds(runs, tag, axis)
    if not len(grid):
        return grid, grid, grid, 0
    std = stacked.std(axis=0, ddof=1) if len(stacked) > 1 else np.zeros(len(grid))
    return grid, stacked.mean(axis=0), std, len(stacked)


def seed_band(stacked: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and interval over seeds at every x: ``statistics.seed_interval`` of each column."""
    columns = [seed_interval(stacked[:, j], confidence) for j in range(stacked.shape[1])]
    mean, low, high = (np.asarray(v, dtype=float) for v in zip(*columns)) if columns else (np.array([]),) * 3
    return mean, low, high


def _sorted_unique(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    keep = np.append(x[1:] != x[:-1], True)  # the last value logged at each x
    return x[keep], y[keep]


PNG_METADATA = {"Software": None, "Title": None, "Author": None, "Description": None, "Creation Time": None}


def arm_colors(names: Sequence[str]) -> dict[str, tuple]:
    """One colour per arm, the same in every figure of a report."""
    import matplotlib

    palette = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {name: palette(i % 20) for i, name in enumerate(names)}


def y_range(arms: Sequence[Arm], tag: str) -> tuple[float, float] | None:
    """The range of every seed's values of ``tag`` (with a margin): one y-range for the figures
    of a curve, so that groups of arms can be compared by eye."""
    values = [y for arm in arms for run in arm.runs for y in run.axis(tag, "step")[1]]
    if not values:
        return None
    low, high = float(min(values)), float(max(values))
    margin = 0.05 * (high - low) if high > low else 0.05 * max(abs(high), 1.0)
    return (low - margin, high + margin)


def plot_curves(arms: Sequence[Arm], tags: Sequence[str], title: str, path: Path, confidence: float = 0.95,
                colors: dict[str, tuple] | None = None, ylims: dict[str, tuple[float, float] | None] | None = None,
                axes_shown: Sequence[tuple[str, str]] = tuple(AXES)) -> None:  # fmt: skip
    """One row per tag, one column per x axis of ``axes_shown``; deterministic PNG bytes."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    rc = {"figure.dpi": 100, "savefig.dpi": 100, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3,
          "path.simplify": False, "svg.hashsalt": "grpo-lightning"}  # fmt: skip
    colors = colors or arm_colors([a.name for a in arms])
    with matplotlib.rc_context(rc):
        width = max(13.0, 4.3 * len(axes_shown))
        fig, axes = plt.subplots(len(tags), len(axes_shown), figsize=(width, 3.4 * len(tags)), squeeze=False)
        for row, tag in enumerate(tags):
            for col, (axis, label) in enumerate(axes_shown):
                ax = axes[row][col]
                drawn = False
                for arm in arms:
                    color = colors[arm.name]
                    x, stacked = aligned_seeds(arm.runs, tag, axis)
                    if not len(x):
                        continue
                    drawn = True
                    for run in arm.runs:
                        rx, ry = run.axis(tag, axis)
                        if len(rx):
                            ax.plot(rx, ry, color=color, linewidth=0.6, alpha=0.35)
                    mean, low, high = seed_band(stacked, confidence)
                    marker = "o" if axis == "step" and len(x) <= 30 else None
                    ax.plot(x, mean, color=color, label=f"{arm.name} (n={len(stacked)})", marker=marker, markersize=3,
                            linewidth=1.6)  # fmt: skip
                    if len(stacked) > 1:
                        ax.fill_between(x, low, high, color=color, alpha=0.18, linewidth=0)
                if not drawn:
                    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
                elif ylims and ylims.get(tag):
                    ax.set_ylim(*ylims[tag])
                ax.set_xlabel(label)
                ax.set_ylabel(tag)
                if row == 0 and col == 0 and drawn:
                    ax.legend(fontsize=8, loc="best")
        fig.suptitle(f"{title}: mean over seeds, band {confidence:.0%} t-interval of the mean, thin lines single seeds")
        height = 3.4 * len(tags)
        fig.subplots_adjust(left=0.06, right=0.99, wspace=0.25, hspace=0.4, top=1 - 0.45 / height, bottom=0.55 / height)
        fig.savefig(path, format="png", metadata=PNG_METADATA)
        plt.close(fig)
    _palettize(path)


def plot_finals(arms: Sequence[Arm], key: str, path: Path, confidence: float = 0.95,
                colors: dict[str, tuple] | None = None, flagged: dict[str, list] | None = None) -> None:  # fmt: skip
    """One column per arm: each seed's final ``key`` as a dot (seeds side by side in seed order), the
    mean with its interval over seeds (``Arm.interval``) as a black bar and the median as a diamond;
    ``flagged``: per arm, the seeds circled in red (far from the others). Deterministic PNG bytes."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    colors = colors or arm_colors([a.name for a in arms])
    rc = {"figure.dpi": 100, "savefig.dpi": 100, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3,
          "path.simplify": False}  # fmt: skip
    with matplotlib.rc_context(rc):
        fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(arms) + 2.0), 3.6))
        for i, arm in enumerate(arms):
            by_seed = arm.finals_by_seed(key)
            seeds = list(by_seed)
            offsets = np.linspace(-0.22, 0.22, len(seeds)) if len(seeds) > 1 else np.zeros(len(seeds))
            ax.scatter(i + offsets, [by_seed[s] for s in seeds], s=22, color=colors[arm.name], zorder=3, linewidths=0)
            circled = [(i + o, by_seed[s]) for o, s in zip(offsets, seeds) if s in (flagged or {}).get(arm.name, ())]
            if circled:
                ax.scatter(*zip(*circled), s=90, facecolors="none", edgecolors="red", linewidths=1.2, zorder=4)
            mean, low, high = arm.interval(key, confidence)
            if np.isfinite(mean):
                ax.plot([i + 0.3, i + 0.3], [low, high] if np.isfinite(low) else [mean, mean], color="black", linewidth=1.4)
                ax.plot([i + 0.25, i + 0.35], [mean, mean], color="black", linewidth=2.0)
                ax.scatter([i + 0.3], [float(np.median(list(by_seed.values())))], marker="D", s=24, color="white",
                           edgecolors="black", zorder=4)  # fmt: skip
        tilted = len(arms) > 4
        ax.set_xticks(range(len(arms)), [a.name for a in arms], rotation=30 if tilted else 0, ha="right" if tilted else "center")
        ax.set_ylabel(key)
        ax.set_title(f"final {key}: dots seeds; bar mean, {confidence:.0%} t-interval; diamond median", fontsize=8)
        fig.tight_layout()
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


def plot_budget_points(columns: Sequence[tuple[str, float, dict[str, list[tuple[float, float, float, float]]]]],
                       labels: Sequence[str], path: Path, confidence: float = 0.95,
                       colors: dict[str, tuple] | None = None) -> None:  # fmt: skip
    """val/accuracy at budgets, one column per ``(axis, budget, {arm: [(x, mean, low, high)]})`` of
    ``columns`` (x label from ``labels``): each arm's means joined by a line, its intervals as error
    bars, the budget as a dashed line; deterministic PNG bytes."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    rc = {"figure.dpi": 100, "savefig.dpi": 100, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3,
          "path.simplify": False, "svg.hashsalt": "grpo-lightning"}  # fmt: skip
    names = list(dict.fromkeys(name for _, _, points in columns for name in points))
    colors = colors or arm_colors(names)
    with matplotlib.rc_context(rc):
        fig, axes = plt.subplots(1, max(len(columns), 1), figsize=(max(13.0, 4.3 * len(columns)), 3.8), squeeze=False)
        for ax, (_, budget, points), label in zip(axes[0], columns, labels):
            for name, rows in points.items():
                x, mean, low, high = (np.asarray(v, dtype=float) for v in zip(*rows))
                below, above = np.nan_to_num(mean - low), np.nan_to_num(high - mean)
                ax.errorbar(x, mean, yerr=[below, above], color=colors[name], marker="o", markersize=3, linewidth=1.4,
                            capsize=3, label=f"{name}")  # fmt: skip
            ax.axvline(budget, color="0.4", linestyle="--", linewidth=0.8)
            ax.set_xlabel(label)
            ax.set_ylabel("val/accuracy")
        if columns and columns[0][2]:
            axes[0][0].legend(fontsize=8, loc="best")
        fig.suptitle(f"val/accuracy at matched budgets: mean over seeds, bars {confidence:.0%} t-interval of the mean")
        fig.subplots_adjust(left=0.06, right=0.99, wspace=0.25, top=0.88, bottom=0.15)
        fig.savefig(path, format="png", metadata=PNG_METADATA)
        plt.close(fig)
    _palettize(path)
