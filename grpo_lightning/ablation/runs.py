"""One run's TensorBoard scalars, with the axes of its learning curves (steps, tokens, seconds)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: Scalars that are not metrics of the algorithm.
IGNORED_TAGS = {"epoch", "hp_metric"}
#: A training scalar present in every step the module logs: the time axis starts from its first event.
STEP_TIME_TAG = "perf/step_s"
TOKENS_TAG = "perf/generated_tokens"
#: Training FLOPs so far (grpo_lightning.runtime.compute), logged by runs since it was added.
FLOPS_TAG = "perf/flops"
#: Logged by runs whose loggers' step is the optimizer steps taken; older runs logged the batch counter.
GENERATION_BATCHES_TAG = "counters/generation_batches"


@dataclass
class Series:
    """One scalar of one run: TensorBoard steps, values and wall times (seconds since the epoch)."""

    steps: np.ndarray
    values: np.ndarray
    wall: np.ndarray


@dataclass
class Run:
    """The scalars of one fit run, with the axes of the learning curves.

    ``scalars`` leaves out the validation before training, which is in ``initial``. For every
    point, ``x_step`` is the number of optimizer steps taken (each rollout may make several; DAPO's
    dynamic sampling can spend several generation batches on one), ``x_tokens`` the completion
    tokens generated so far, ``x_flops`` the training FLOPs so far (:mod:`grpo_lightning.runtime.compute`) and ``x_time`` the seconds since training began (validation time
    included). Runs logged before the loggers' step counted optimizer steps give the training
    steps done instead (each row of training metrics one).
    """

    directory: Path
    scalars: dict[str, Series]
    initial: dict[str, float] = field(default_factory=dict)
    t0: float = math.nan
    train_time_s: float = math.nan
    update_steps: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.int64))
    #: Optimizer steps per training step, for runs that logged the batch counter (read from the
    #: cell's config by :func:`optimizer_steps_per_rollout`); runs with ``counters/*`` ignore it.
    updates_per_step: int = 1

    def axis(self, tag: str, axis: str, include_initial: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` of ``tag`` against ``"step"``, ``"tokens"``, ``"flops"`` or ``"time"``."""
        series = self.scalars.get(tag)
        xs: list[float] = []
        ys: list[float] = []
        if include_initial and tag in self.initial:
            xs.append(0.0)
            ys.append(self.initial[tag])
        if series is not None:
            if axis == "step":
                x = self.steps_done(series.steps)
            elif axis == "tokens":
                x = self._cumulative_at(TOKENS_TAG, series.steps)
            elif axis == "flops":
                x = self._cumulative_at(FLOPS_TAG, series.steps)
            elif axis == "time":
                x = series.wall - self.t0
            else:
                raise ValueError(f"axis: {axis!r} is not 'step', 'tokens', 'flops' or 'time'")
            xs.extend(x.tolist())
            ys.extend(series.values.tolist())
        x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
        keep = np.isfinite(x) & np.isfinite(y)
        return x[keep], y[keep]

    @property
    def steps_are_optimizer_steps(self) -> bool:
        """Whether the run's TensorBoard steps are optimizer steps (it logged ``counters/*``)."""
        return GENERATION_BATCHES_TAG in self.scalars

    def optimizer_steps(self) -> float:
        """Optimizer steps taken by the last training step (older runs: training steps done)."""
        if not len(self.update_steps):
            return math.nan
        if self.steps_are_optimizer_steps:
            return float(self.update_steps[-1])
        return float(len(self.update_steps) * self.updates_per_step)

    def generation_batches(self) -> float:
        """Batches of prompts sampled for training (DAPO's dynamic sampling draws several per update)."""
        series = self.scalars.get(GENERATION_BATCHES_TAG)
        if series is None or not len(series.values):
            return math.nan  # older runs did not count them (DAPO's logged step counted its updates)
        return float(series.values[-1])

    def steps_done(self, tb_steps: np.ndarray) -> np.ndarray:
        """Optimizer steps taken at each TensorBoard step (older runs: training steps done at each
        value of the logger's batch counter)."""
        if self.steps_are_optimizer_steps:
            return tb_steps.astype(float)
        if not len(self.update_steps):
            return (tb_steps.astype(float) + 1.0) * self.updates_per_step
        return np.searchsorted(self.update_steps, tb_steps, side="right").astype(float) * self.updates_per_step

    def _cumulative_at(self, counter: str, steps: np.ndarray) -> np.ndarray:
        """The running total ``counter`` (tokens, FLOPs) up to and including each TensorBoard step."""
        totals = self.scalars.get(counter)
        if totals is None or len(totals.steps) == 0:
            return np.full(len(steps), math.nan)
        index = np.searchsorted(totals.steps, steps, side="right") - 1
        out = np.where(index >= 0, totals.values[np.clip(index, 0, None)], 0.0)
        return out.astype(float)


def event_directory(run_dir: Path) -> Path:
    """The directory holding the run's TensorBoard event files (the run directory or one below it)."""
    run_dir = Path(run_dir)
    if any(run_dir.glob("events.out.tfevents.*")):
        return run_dir
    parents = sorted({p.parent for p in run_dir.rglob("events.out.tfevents.*")})
    if not parents:
        raise FileNotFoundError(f"no TensorBoard event files under {run_dir}")
    if len(parents) > 1:
        raise ValueError(f"{run_dir} holds several runs' event files: {[str(p) for p in parents]}")
    return parents[0]


def read_scalars(directory: Path) -> dict[str, Series]:
    """Every scalar of the event files in ``directory``, read with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    accumulator = EventAccumulator(str(directory), size_guidance={SCALARS: 0})
    accumulator.Reload()
    scalars = {}
    for tag in sorted(accumulator.Tags()[SCALARS]):
        if tag in IGNORED_TAGS:
            continue
        events = accumulator.Scalars(tag)
        scalars[tag] = Series(
            steps=np.asarray([e.step for e in events], dtype=np.int64),
            values=np.asarray([e.value for e in events], dtype=float),
            wall=np.asarray([e.wall_time for e in events], dtype=float),
        )
    return scalars


#: A run's scalars as gzipped CSV text (``zcat`` reads it), in the ``data/`` folder beside a
#: report (``report.data``).
SCALARS_FILE = "scalars.csv.gz"
SCALARS_HEADER = ["tag", "step", "value", "wall"]


#: The marker a cell's folder gets once its fit finished (``ablation.sweep``); a folder without it is unfinished.
DONE_FILE = "DONE"


def is_done(cell_dir: Path) -> bool:
    return (Path(cell_dir) / DONE_FILE).is_file()


def has_scalars(run_dir: Path) -> bool:
    """Whether a run folder holds its step-wise scalars, which every report section but a few needs:
    ``scalars.csv.gz`` (a report's ``data/``) or TensorBoard event files (a sweep's cell)."""
    run_dir = Path(run_dir)
    return (run_dir / SCALARS_FILE).is_file() or any(run_dir.rglob("events.out.tfevents.*"))


def write_scalars_csv(scalars: Mapping[str, Series], path: Path) -> None:
    """``tag,step,value,wall``, one row per logged point; values as ``repr`` so that reading them
    back gives the same floats, and the report the same bytes. Gzipped without a time stamp, so
    the file's bytes depend on the scalars alone."""
    import csv
    import gzip
    import io

    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed, \
            io.TextIOWrapper(packed, encoding="utf-8", newline="") as out:  # fmt: skip
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(SCALARS_HEADER)
        for tag in sorted(scalars):
            series = scalars[tag]
            for step, value, wall in zip(series.steps, series.values, series.wall):
                writer.writerow([tag, int(step), repr(float(value)), repr(float(wall))])


def read_scalars_csv(path: Path) -> dict[str, Series]:
    """The scalars ``write_scalars_csv`` wrote."""
    import csv
    import gzip

    rows: dict[str, list[tuple[int, float, float]]] = {}
    with gzip.open(path, "rt", encoding="utf-8", newline="") as lines:
        reader = csv.reader(lines)
        if next(reader, None) != SCALARS_HEADER:
            raise ValueError(f"{path}: expected the header {','.join(SCALARS_HEADER)}")
        for tag, step, value, wall in reader:
            rows.setdefault(tag, []).append((int(step), float(value), float(wall)))
    return {
        tag: Series(np.asarray([r[0] for r in points], dtype=np.int64), np.asarray([r[1] for r in points], dtype=float),
                    np.asarray([r[2] for r in points], dtype=float))
        for tag, points in sorted(rows.items())
    }  # fmt: skip


def optimizer_steps_per_rollout(config: dict) -> int:
    """Optimizer steps a fit of ``config`` (a cell's resolved ``config.yaml``) takes per rollout:
    ``ppo_epochs`` passes, each one step per ``minibatch_size`` rows of ``batch_size x group_size``."""
    model = config.get("model") or {}
    model = model.get("init_args", model)
    data = config.get("data") or {}
    data = data.get("init_args", data)
    sampling, optim = model.get("sampling") or model, model.get("optim") or model  # flat in runs before the groups
    rows = int(data.get("batch_size") or 1) * int(sampling.get("group_size") or 1)
    minibatch = optim.get("minibatch_size")
    return int(optim.get("ppo_epochs") or 1) * (math.ceil(rows / int(minibatch)) if minibatch else 1)


def load_run(run_dir: str | Path) -> Run:
    """Read a run's scalars (its TensorBoard events, or ``scalars.csv`` in a report's ``data/``)
    and split off the validation logged before the first training step."""
    run_dir = Path(run_dir)
    csv_file = run_dir / SCALARS_FILE
    scalars = read_scalars_csv(csv_file) if csv_file.is_file() else read_scalars(event_directory(run_dir))
    train_walls = [s.wall[0] for tag, s in scalars.items() if not tag.startswith("val/") and len(s.wall)]
    first_train = min(train_walls) if train_walls else math.inf
    initial: dict[str, float] = {}
    before_training: dict[str, Series] = {}
    for tag, series in list(scalars.items()):
        if not tag.startswith("val/"):
            continue
        before = series.wall < first_train
        if before.any():
            initial[tag] = float(series.values[before][-1])
            before_training[tag] = Series(series.steps[before][-1:], series.values[before][-1:], series.wall[before][-1:])
            scalars[tag] = Series(series.steps[~before], series.values[~before], series.wall[~before])
    train_tags = [tag for tag in scalars if not tag.startswith("val/")]
    update_steps = _update_steps(scalars, train_tags)
    if TOKENS_TAG in scalars:
        # Lightning logs the last values again on a batch that logged nothing (no update, e.g.
        # DAPO waiting for informative groups): keep the steps that generated new tokens only.
        for tag in train_tags:
            series = scalars[tag]
            keep = np.isin(series.steps, update_steps)
            scalars[tag] = Series(series.steps[keep], series.values[keep], series.wall[keep])
    # training began when the validation before it ended, else when the first step began
    t0 = math.nan
    if initial:
        t0 = max(float(s.wall[0]) for s in before_training.values())
    elif STEP_TIME_TAG in scalars and len(scalars[STEP_TIME_TAG].wall):
        t0 = float(scalars[STEP_TIME_TAG].wall[0] - scalars[STEP_TIME_TAG].values[0])
    elif math.isfinite(first_train):
        t0 = float(first_train)
    last_train = max((float(scalars[t].wall[-1]) for t in train_tags if len(scalars[t].wall)), default=math.nan)
    return Run(run_dir, scalars, initial, t0, last_train - t0, update_steps)


def _update_steps(scalars: Mapping[str, Series], train_tags: Sequence[str]) -> np.ndarray:
    """TensorBoard steps of the training steps that updated the policy."""
    tokens = scalars.get(TOKENS_TAG)
    if tokens is not None and len(tokens.steps):
        previous = np.concatenate([[0.0], tokens.values[:-1]])
        return np.unique(tokens.steps[tokens.values > previous])
    if STEP_TIME_TAG in scalars:
        return np.unique(scalars[STEP_TIME_TAG].steps)
    steps = [scalars[t].steps for t in train_tags]
    return np.unique(np.concatenate(steps)) if steps else np.array([], dtype=np.int64)
