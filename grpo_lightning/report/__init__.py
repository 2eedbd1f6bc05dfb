"""``grpo-lightning-report``: a Markdown + HTML report of a sweep's TensorBoard logs.

    grpo-lightning-report runs/ablation/default
    grpo-lightning-report runs/ablation/default --name default --out reports/

Writes ``<out>/<name>/report.md``, ``report.html`` and one PNG per learning curve. Runs are
grouped into *arms*: cells that differ only in their seed (``cell.json`` written by
``grpo-lightning-ablate``; for plain ``grpo-lightning fit`` directories the model class and the
seed come from the saved ``config.yaml``). The report is a pure function of the logs:
regenerating it from the same sweep directory gives byte-identical files.

Statistics: the mean over seeds with a Student-t confidence interval (``mean_ci``), Welch's
unequal-variance t-test between arms (``welch_test``), Holm's correction over the pairs.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------- statistics


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student-t confidence interval ``(mean, low, high)`` of independent samples.

    ``mean +- t_{(1 + confidence) / 2, n - 1} * s / sqrt(n)`` with ``s`` the sample standard
    deviation (``ddof=1``). One value gives ``(value, nan, nan)``; none gives three ``nan``.
    """
    from scipy import stats

    x = np.asarray([float(v) for v in values], dtype=float)
    x = x[np.isfinite(x)]
    n = len(x)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    mean = float(x.mean())
    if n == 1:
        return (mean, math.nan, math.nan)
    half = float(stats.t.ppf((1.0 + confidence) / 2.0, n - 1)) * float(x.std(ddof=1)) / math.sqrt(n)
    return (mean, mean - half, mean + half)


def welch_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Welch's two-sided t-test of equal means without assuming equal variances: ``(t, p)``.

    ``t = (mean_a - mean_b) / sqrt(s_a^2 / n_a + s_b^2 / n_b)``; ``nan`` when either sample
    has fewer than two values or both have zero variance.
    """
    from scipy import stats

    x, y = _finite_array(a), _finite_array(b)
    if len(x) < 2 or len(y) < 2:
        return (math.nan, math.nan)
    if x.var(ddof=1) == 0 and y.var(ddof=1) == 0:
        return (math.nan, math.nan)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # nearly identical samples: precision notes
        result = stats.ttest_ind(x, y, equal_var=False)
    return (float(result.statistic), float(result.pvalue))


def welch_dof(a: Sequence[float], b: Sequence[float]) -> float:
    """Welch-Satterthwaite degrees of freedom of ``welch_test(a, b)``."""
    x, y = _finite_array(a), _finite_array(b)
    if len(x) < 2 or len(y) < 2:
        return math.nan
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    if va + vb == 0:
        return math.nan
    return float((va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1)))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (``nan`` entries stay ``nan`` and are not counted)."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if math.isfinite(p))
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    m = len(indexed)
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def _finite_array(values: Sequence[float]) -> np.ndarray:
    x = np.asarray([float(v) for v in values], dtype=float)
    return x[np.isfinite(x)]


# ---------------------------------------------------------------------------- reading the logs

#: Scalars that are not metrics of the algorithm.
IGNORED_TAGS = {"epoch", "hp_metric"}
#: A training scalar present in every step the module logs: the time axis starts from its first event.
STEP_TIME_TAG = "perf/step_s"
TOKENS_TAG = "perf/generated_tokens"


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
    point, ``x_step`` is the number of training steps done, counting the steps that logged
    training metrics (a step ends in a policy update; DAPO's dynamic sampling can spend several
    generation batches on one), ``x_tokens`` the completion tokens generated so far and
    ``x_time`` the seconds since training began (validation time included).
    """

    directory: Path
    scalars: dict[str, Series]
    initial: dict[str, float] = field(default_factory=dict)
    t0: float = math.nan
    train_time_s: float = math.nan
    update_steps: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.int64))

    def axis(self, tag: str, axis: str, include_initial: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` of ``tag`` against ``"step"``, ``"tokens"`` or ``"time"``."""
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
                x = self._tokens_at(series.steps)
            elif axis == "time":
                x = series.wall - self.t0
            else:
                raise ValueError(f"axis: {axis!r} is not 'step', 'tokens' or 'time'")
            xs.extend(x.tolist())
            ys.extend(series.values.tolist())
        x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
        keep = np.isfinite(x) & np.isfinite(y)
        return x[keep], y[keep]

    def steps_done(self, tb_steps: np.ndarray) -> np.ndarray:
        """Training steps done at each TensorBoard step (the logger's batch counter)."""
        if not len(self.update_steps):
            return tb_steps.astype(float) + 1.0
        return np.searchsorted(self.update_steps, tb_steps, side="right").astype(float)

    def _tokens_at(self, steps: np.ndarray) -> np.ndarray:
        tokens = self.scalars.get(TOKENS_TAG)
        if tokens is None or len(tokens.steps) == 0:
            return np.full(len(steps), math.nan)
        # the tokens generated up to and including TensorBoard step s
        index = np.searchsorted(tokens.steps, steps, side="right") - 1
        out = np.where(index >= 0, tokens.values[np.clip(index, 0, None)], 0.0)
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


def load_run(run_dir: str | Path) -> Run:
    """Read a run's scalars and split off the validation logged before the first training step."""
    run_dir = Path(run_dir)
    scalars = read_scalars(event_directory(run_dir))
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


# ---------------------------------------------------------------------------- finding the cells


@dataclass
class CellInfo:
    directory: Path
    name: str
    arm: str
    variant: str
    seed: int | None
    overrides: dict[str, Any]
    finished: bool
    config: dict[str, Any]


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def discover_cells(sweep_dir: Path) -> list[CellInfo]:
    """Cells of a sweep: folders with ``cell.json``, else folders with event files and a config."""
    sweep_dir = Path(sweep_dir)
    cells = []
    cell_files = sorted(sweep_dir.rglob("cell.json"))
    if cell_files:
        for path in cell_files:
            record = json.loads(path.read_text())
            directory = path.parent
            cells.append(
                CellInfo(
                    directory=directory,
                    name=str(record.get("name", directory.name)),
                    arm=str(record.get("arm", record.get("variant", directory.name))),
                    variant=str(record.get("variant", "")),
                    seed=record.get("seed"),
                    overrides=dict(record.get("overrides") or {}),
                    finished=(directory / "DONE").is_file(),
                    config=_read_yaml(directory / "config.yaml"),
                )
            )
    else:
        for config_path in sorted(sweep_dir.rglob("config.yaml")):
            directory = config_path.parent
            if not any(directory.rglob("events.out.tfevents.*")):
                continue
            config = _read_yaml(config_path)
            model = config.get("model") or {}
            class_path = model.get("class_path", "") if isinstance(model, dict) else ""
            variant = class_path.rsplit(".", 1)[-1] or directory.name
            cells.append(
                CellInfo(directory, directory.relative_to(sweep_dir).as_posix(), variant, variant,
                         config.get("seed_everything"), {}, True, config)
            )  # fmt: skip
    return sorted(cells, key=lambda c: (c.arm, c.seed if isinstance(c.seed, int) else -1, c.name))


# ---------------------------------------------------------------------------- configuration tables

#: Settings that differ between the cells of one arm by construction.
PER_CELL_KEYS = ("seed_everything", "trainer.default_root_dir", "trainer.logger.init_args.save_dir")


def flatten_config(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a nested config; list items as ``key[i]``; leaves as compact YAML-ish text."""
    flat: dict[str, Any] = {}
    if isinstance(tree, Mapping):
        if not tree and prefix:
            flat[prefix] = "{}"
        for key in tree:
            flat.update(flatten_config(tree[key], f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(tree, list) and any(isinstance(v, (Mapping, list)) for v in tree):
        for i, value in enumerate(tree):
            flat.update(flatten_config(value, f"{prefix}[{i}]"))
    else:
        flat[prefix] = _config_text(tree)
    return flat


def _config_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_config_text(v) for v in value) + "]"
    if isinstance(value, str) and value == "":
        return "''"
    return str(value)


def arm_configs(cells: Sequence[CellInfo]) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """Per arm: the flattened config of its first cell, and keys that differ inside the arm."""
    by_arm: dict[str, list[CellInfo]] = {}
    for cell in cells:
        by_arm.setdefault(cell.arm, []).append(cell)
    configs, inconsistent = {}, {}
    for arm, members in by_arm.items():
        flats = [
            {k: v for k, v in flatten_config(c.config).items() if k not in PER_CELL_KEYS} for c in members if c.config
        ]
        configs[arm] = flats[0] if flats else {}
        keys = sorted({k for f in flats for k in f})
        inconsistent[arm] = [k for k in keys if len({f.get(k, "\0") for f in flats}) > 1]
    return configs, inconsistent


# ---------------------------------------------------------------------------- documents (md + html)


@dataclass
class Doc:
    """A small document model rendered to both Markdown and HTML."""

    blocks: list[tuple] = field(default_factory=list)

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", level, text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def items(self, items: Sequence[str]) -> None:
        self.blocks.append(("ul", list(items)))

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> None:
        self.blocks.append(("table", list(header), [list(r) for r in rows], align or "l" + "r" * (len(header) - 1)))

    def img(self, alt: str, src: str) -> None:
        self.blocks.append(("img", alt, src))

    def details(self, summary: str, body: Doc) -> None:
        self.blocks.append(("details", summary, body))

    def markdown(self) -> str:
        out: list[str] = []
        for block in self.blocks:
            kind = block[0]
            if kind == "h":
                out.append("#" * block[1] + " " + block[2])
            elif kind == "p":
                out.append(block[1])
            elif kind == "ul":
                out.append("\n".join(f"- {item}" for item in block[1]))
            elif kind == "table":
                _, header, rows, align = block
                lines = ["| " + " | ".join(_md_cell(c) for c in header) + " |"]
                lines.append("|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|")
                lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
                out.append("\n".join(lines))
            elif kind == "img":
                out.append(f"![{block[1]}]({block[2]})")
            elif kind == "details":
                out.append(f"<details><summary>{html.escape(block[1])}</summary>\n\n{block[2].markdown().rstrip()}\n\n</details>")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        body = self._html_body()
        return (
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>\n{_CSS}</style>\n</head>\n<body>\n{body}</body>\n</html>\n"
        )

    def _html_body(self) -> str:
        out: list[str] = []
        for block in self.blocks:
            kind = block[0]
            if kind == "h":
                level = block[1]
                anchor = re.sub(r"[^a-z0-9]+", "-", block[2].lower()).strip("-")
                out.append(f"<h{level} id=\"{anchor}\">{_inline_html(block[2])}</h{level}>")
            elif kind == "p":
                out.append(f"<p>{_inline_html(block[1])}</p>")
            elif kind == "ul":
                out.append("<ul>\n" + "".join(f"<li>{_inline_html(i)}</li>\n" for i in block[1]) + "</ul>")
            elif kind == "table":
                _, header, rows, align = block
                style = ["" if a == "l" else " class=\"num\"" for a in align]
                lines = ["<table>", "<thead><tr>" + "".join(f"<th{s}>{_inline_html(c)}</th>" for c, s in zip(header, style)) + "</tr></thead>", "<tbody>"]
                lines += ["<tr>" + "".join(f"<td{s}>{_inline_html(c)}</td>" for c, s in zip(row, style)) + "</tr>" for row in rows]
                lines += ["</tbody>", "</table>"]
                out.append("\n".join(lines))
            elif kind == "img":
                out.append(f"<p><img src=\"{html.escape(block[2])}\" alt=\"{html.escape(block[1])}\"></p>")
            elif kind == "details":
                out.append(f"<details><summary>{html.escape(block[1])}</summary>\n{block[2]._html_body()}</details>")
        return "\n".join(out) + "\n"


_CSS = """body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; vertical-align: top; }
th { background: #f3f3f3; }
td.num, th.num { text-align: right; }
code { background: #f3f3f3; padding: 0 0.2em; }
img { max-width: 100%; }
details { margin: 1em 0; }
"""


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _inline_html(text: str) -> str:
    escaped = html.escape(str(text), quote=False)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)


# ---------------------------------------------------------------------------- the report

#: Final metrics of the table: (key, label, direction) with direction +1 higher is better,
#: -1 lower is better, 0 no preference. Keys are scalar tags or the computed entries below.
FINAL_METRICS = [
    ("val/accuracy", "val/accuracy", 1),
    ("initial:val/accuracy", "val/accuracy before training", 0),
    ("gain:val/accuracy", "val/accuracy gain", 1),
    ("val/reward", "val/reward", 1),
    ("val/mean_length", "val/mean_length", 0),
    ("reward", "reward", 1),
    ("reward_std", "reward_std", 0),
    ("frac_reward_zero_std", "frac_reward_zero_std", 0),
    ("kl", "kl", 0),
    ("entropy", "entropy", 0),
    ("completions/mean_length", "completions/mean_length", 0),
    ("clip_ratio/low", "clip_ratio/low", 0),
    ("clip_ratio/high", "clip_ratio/high", 0),
    ("steps", "training steps", 0),
    ("batches", "rollout batches", 0),
    ("perf/generated_tokens", "generated tokens", -1),
    ("train_time_s", "training wall-clock (s)", -1),
]

#: Columns of the per-run table.
PER_RUN_METRICS = {"val/accuracy", "initial:val/accuracy", "reward", "kl", "steps", "perf/generated_tokens", "train_time_s"}

#: Learning curves: file stem, title, tags drawn (one row each).
CURVES = [
    ("val_accuracy", "val/accuracy", ["val/accuracy"]),
    ("reward", "reward", ["reward"]),
    ("kl", "kl", ["kl"]),
    ("entropy", "entropy", ["entropy"]),
    ("mean_length", "completions/mean_length", ["completions/mean_length"]),
    ("clip_ratio", "clip_ratio", ["clip_ratio/low", "clip_ratio/high"]),
    ("frac_reward_zero_std", "frac_reward_zero_std", ["frac_reward_zero_std"]),
]
AXES = [("step", "training step"), ("tokens", "generated tokens"), ("time", "wall-clock seconds")]

#: Metrics the summary paragraph names a winner for: (key, label, superlative, direction).
SUMMARY_METRICS = [
    ("val/accuracy", "final val/accuracy", "highest", 1),
    ("reward", "final training reward", "highest", 1),
    ("kl", "final KL to the reference", "lowest", -1),
    ("perf/generated_tokens", "generated tokens", "fewest", -1),
    ("train_time_s", "training wall-clock", "shortest", -1),
]
UNITS = {"train_time_s": " s"}


def fmt(value: float, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    return f"{value:.{digits}g}"


def fmt_p(p: float) -> str:
    if not math.isfinite(p):
        return "n/a"
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


def final_value(run: Run, key: str) -> float:
    """A run's final value of a metric key of ``FINAL_METRICS``."""
    if key.startswith("initial:"):
        return run.initial.get(key.split(":", 1)[1], math.nan)
    if key.startswith("gain:"):
        tag = key.split(":", 1)[1]
        return final_value(run, tag) - run.initial.get(tag, math.nan)
    if key == "train_time_s":
        return run.train_time_s
    if key == "steps":
        return float(len(run.update_steps)) if len(run.update_steps) else math.nan
    if key == "batches":
        return float(run.update_steps[-1] + 1) if len(run.update_steps) else math.nan
    series = run.scalars.get(key)
    if series is None or not len(series.values):
        return math.nan
    return float(series.values[-1])


@dataclass
class Arm:
    name: str
    cells: list[CellInfo]
    runs: list[Run]

    def finals(self, key: str) -> list[float]:
        return [v for v in (final_value(r, key) for r in self.runs) if math.isfinite(v)]


def build_report(
    sweep_dir: str | Path,
    out_dir: str | Path,
    name: str | None = None,
    confidence: float = 0.95,
    provenance: Sequence[str] = (),
) -> Path:
    """Write ``report.md``, ``report.html`` and the curve PNGs of a sweep; returns the folder.

    ``provenance``: lines for a "Provenance" section (the command, commit and machine that ran
    the sweep), given by the caller so the report stays a pure function of its inputs.
    """
    sweep_dir = Path(sweep_dir)
    name = name or sweep_dir.resolve().name
    target = Path(out_dir) / name
    target.mkdir(parents=True, exist_ok=True)

    cells = discover_cells(sweep_dir)
    if not cells:
        raise FileNotFoundError(f"no runs under {sweep_dir}: expected cell folders of grpo-lightning-ablate")
    finished = [c for c in cells if c.finished]
    unfinished = [c for c in cells if not c.finished]
    arms: dict[str, Arm] = {}
    for cell in finished:
        arms.setdefault(cell.arm, Arm(cell.arm, [], []))
        arms[cell.arm].cells.append(cell)
        arms[cell.arm].runs.append(load_run(cell.directory))
    arm_list = [arms[a] for a in sorted(arms, key=lambda a: _arm_order(a, finished))]

    doc = Doc()
    doc.h(1, f"Ablation report: {name}")
    doc.p(
        f"Sweep folder `{sweep_dir.resolve().name}`: {len(arm_list)} arms, {len(finished)} finished runs"
        + (f", {len(unfinished)} unfinished (left out)" if unfinished else "")
        + f". Intervals are {confidence:.0%} Student-t confidence intervals over seeds."
    )
    doc.h(2, "Summary")
    doc.p(summary_paragraph(arm_list))

    _runs_section(doc, arm_list, unfinished)
    _config_section(doc, arm_list)
    _final_section(doc, arm_list, confidence)
    _pairwise_section(doc, arm_list)
    _curves_section(doc, arm_list, target)
    _notes_section(doc, confidence)
    if provenance:
        doc.h(2, "Provenance")
        doc.items(list(provenance))

    (target / "report.md").write_text(doc.markdown())
    (target / "report.html").write_text(doc.html(f"Ablation report: {name}"))
    return target


#: The order of the built-in variants in tables and plots; other arms follow by name.
VARIANT_ORDER = ["grpo", "dr_grpo", "dapo", "rloo", "gspo"]


def _join_names(names: Sequence[str]) -> str:
    bold = [f"**{n}**" for n in names]
    return bold[0] if len(bold) == 1 else ", ".join(bold[:-1]) + " and " + bold[-1]


def _p_phrase(p: float) -> str:
    return "< 0.0001" if p < 1e-4 else f"= {p:.4f}"


def _arm_order(arm: str, cells: Sequence[CellInfo]) -> tuple:
    variant = next((c.variant for c in cells if c.arm == arm), arm)
    rank = VARIANT_ORDER.index(variant) if variant in VARIANT_ORDER else len(VARIANT_ORDER)
    return (rank, variant, arm)


def _runs_section(doc: Doc, arms: Sequence[Arm], unfinished: Sequence[CellInfo]) -> None:
    doc.h(2, "Runs")
    rows = []
    for arm in arms:
        seeds = ", ".join(str(c.seed) for c in arm.cells)
        overrides = ", ".join(f"`{k}`={v}" for k, v in sorted(arm.cells[0].overrides.items())) or "—"
        rows.append([f"**{arm.name}**", arm.cells[0].variant or "—", overrides, seeds, str(len(arm.runs))])
    doc.table(["arm", "variant", "overrides", "seeds", "runs"], rows, "lllll")
    if unfinished:
        doc.p("Unfinished cells (no `DONE` marker; not counted): " + ", ".join(f"`{c.name}`" for c in unfinished) + ".")


def _config_section(doc: Doc, arms: Sequence[Arm]) -> None:
    doc.h(2, "Configuration")
    configs, inconsistent = arm_configs([c for arm in arms for c in arm.cells])
    names = [a.name for a in arms]
    keys = sorted({k for a in names for k in configs.get(a, {})})
    differing = [k for k in keys if len({configs.get(a, {}).get(k, "—") for a in names}) > 1]
    shared = [k for k in keys if k not in differing]
    if not keys:
        doc.p("No saved `config.yaml` found in the run folders.")
        return
    doc.p(
        "From each run's `config.yaml` (the resolved configuration LightningCLI saved). Per-run paths "
        "and the seed are left out. Settings that differ between arms:"
    )
    if differing and len(names) > 1:
        doc.table(["setting", *names], [[f"`{k}`", *(configs.get(a, {}).get(k, "—") for a in names)] for k in differing], "l" * (len(names) + 1))
    else:
        doc.p("None: every arm has the same configuration.")
    for arm in names:
        if inconsistent.get(arm):
            doc.p(f"Warning: the seeds of **{arm}** differ in " + ", ".join(f"`{k}`" for k in inconsistent[arm]) + ".")
    body = Doc()
    body.table(["setting", "value"], [[f"`{k}`", configs[names[0]].get(k, "—")] for k in shared], "ll")
    doc.details(f"Settings shared by every arm ({len(shared)})", body)


def _final_section(doc: Doc, arms: Sequence[Arm], confidence: float) -> None:
    doc.h(2, "Final metrics")
    doc.p(
        f"Last logged value of each run; mean [{confidence:.0%} CI] over seeds (n = runs). "
        "**Bold**: the best arm where higher (accuracy, reward) or lower (tokens, time) is better, unless tied."
    )
    header = ["metric", *(f"{a.name} (n={len(a.runs)})" for a in arms)]
    rows = []
    for key, label, direction in FINAL_METRICS:
        stats = [mean_ci(a.finals(key), confidence) for a in arms]
        if all(not math.isfinite(s[0]) for s in stats):
            continue
        best = _best_index([s[0] for s in stats], direction) if len(arms) > 1 else None
        row = [label]
        for i, (mean, low, high) in enumerate(stats):
            text = fmt(mean) if not math.isfinite(low) else f"{fmt(mean)} [{fmt(low)}, {fmt(high)}]"
            row.append(f"**{text}**" if i == best else text)
        rows.append(row)
    doc.table(header, rows)
    keys = [(k, label) for k, label, _ in FINAL_METRICS if k in PER_RUN_METRICS]
    body = Doc()
    body.table(
        ["run", "seed", *(label for _, label in keys)],
        [
            [cell.name, str(cell.seed), *(fmt(final_value(run, k)) for k, _ in keys)]
            for arm in arms
            for cell, run in zip(arm.cells, arm.runs)
        ],
        "ll" + "r" * len(keys),
    )
    doc.details("Final values of every run", body)


def _best_index(means: Sequence[float], direction: int) -> int | None:
    if direction == 0:
        return None
    finite = [(m * direction, -i) for i, m in enumerate(means) if math.isfinite(m)]
    if len(finite) < 2:
        return None
    best = max(finite)
    if sum(1 for value, _ in finite if value == best[0]) > 1:
        return None  # a tie: nobody in bold
    return -best[1]


def pairwise_rows(arms: Sequence[Arm], key: str = "val/accuracy") -> list[dict[str, Any]]:
    """Welch tests of every pair of arms on a final metric, with Holm-adjusted p-values."""
    rows = []
    for a, b in combinations(arms, 2):
        x, y = a.finals(key), b.finals(key)
        t, p = welch_test(x, y)
        rows.append(
            {"a": a.name, "b": b.name, "n_a": len(x), "n_b": len(y),
             "mean_a": float(np.mean(x)) if x else math.nan, "mean_b": float(np.mean(y)) if y else math.nan,
             "t": t, "dof": welch_dof(x, y), "p": p, "x": x, "y": y}
        )  # fmt: skip
    for row, adjusted in zip(rows, holm([r["p"] for r in rows])):
        row["p_holm"] = adjusted
        row["verdict"] = _verdict(row)
    return rows


def _verdict(row: Mapping[str, Any]) -> str:
    if min(row["n_a"], row["n_b"]) < 2:
        return "n too small for a test (needs at least 2 seeds per arm)"
    if not math.isfinite(row["p"]):
        return "no variance within either arm: test undefined"
    caution = " (n=2 per arm: low power)" if min(row["n_a"], row["n_b"]) < 3 else ""
    if row["p"] < 0.05:
        holm_note = "" if row["p_holm"] < 0.05 else ", not after Holm correction"
        return f"significant at 0.05{holm_note}{caution}"
    return f"not significant at 0.05{caution}"


def _pairwise_section(doc: Doc, arms: Sequence[Arm]) -> None:
    doc.h(2, "Pairwise comparison on final val/accuracy")
    doc.p(
        "Welch's two-sided t-test (unequal variances) of the final val/accuracy of every pair of arms; "
        "`dof` is the Welch-Satterthwaite degrees of freedom and `p (Holm)` corrects for the number of pairs."
    )
    rows = pairwise_rows(arms)
    if not rows:
        doc.p("Only one arm: nothing to compare.")
        return
    doc.table(
        ["A", "B", "n A", "n B", "mean A − B", "t", "dof", "p", "p (Holm)", "verdict"],
        [
            [r["a"], r["b"], str(r["n_a"]), str(r["n_b"]), fmt(r["mean_a"] - r["mean_b"]), fmt(r["t"]),
             fmt(r["dof"]), fmt_p(r["p"]), fmt_p(r["p_holm"]), r["verdict"]]
            for r in rows
        ],  # fmt: skip
        "llrrrrrrrl",
    )


def summary_paragraph(arms: Sequence[Arm]) -> str:
    """Which arm won on which metric, and whether its lead over the runner-up is significant."""
    if not arms:
        return "No finished runs."
    seeds = sorted({len(a.runs) for a in arms})
    parts = [f"{len(arms)} arm{'s' if len(arms) != 1 else ''} with {'/'.join(map(str, seeds))} seed(s) each."]
    if len(arms) < 2:
        return parts[0] + " With a single arm there is no comparison."
    for key, label, superlative, direction in SUMMARY_METRICS:
        scored = [(float(np.mean(a.finals(key))), a) for a in arms if a.finals(key)]
        if len(scored) < 2:
            continue
        scored.sort(key=lambda s: -direction * s[0])  # stable: ties keep the table order
        (best, winner), (second, runner_up) = scored[0], scored[1]
        unit = UNITS.get(key, "")
        if best == second:
            tied = [a.name for value, a in scored if value == best]
            parts.append(f"{_join_names(tied)} tie on {label} ({fmt(best) + unit}).")
            continue
        t, p = welch_test(winner.finals(key), runner_up.finals(key))
        if not math.isfinite(p):
            reason = "too few seeds to test" if min(len(winner.runs), len(runner_up.runs)) < 2 else "no variance within the arms"
            verdict = f"the gap to **{runner_up.name}** ({fmt(second) + unit}) is not tested ({reason})"
        else:
            word = "significant" if p < 0.05 else "not significant"
            verdict = f"its lead over **{runner_up.name}** ({fmt(second) + unit}) is {word} (Welch p {_p_phrase(p)})"
        parts.append(f"**{winner.name}** has the {superlative} {label} ({fmt(best) + unit}); {verdict}.")
    initial = [v for a in arms for v in a.finals("initial:val/accuracy")]
    if initial:
        parts.append(f"Before training, val/accuracy was {fmt(float(np.mean(initial)))}.")
    return " ".join(parts)


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


def _curves_section(doc: Doc, arms: Sequence[Arm], target: Path) -> None:
    doc.h(2, "Learning curves")
    doc.p(
        "Mean over seeds where every seed has data (linear interpolation between logged points); the band "
        "is ± one standard deviation across seeds. Columns: against training "
        "steps, against completion tokens generated (compute-normalised) and against wall-clock seconds "
        "since training began (validation time included). Step 0 of val/accuracy is the "
        "validation before training, when it was run."
    )
    for stem, title, tags in CURVES:
        if not any(tag in run.scalars or tag in run.initial for arm in arms for run in arm.runs for tag in tags):
            continue
        filename = f"curves_{stem}.png"
        plot_curves(arms, tags, title, target / filename)
        doc.h(3, title)
        doc.img(title, filename)


PNG_METADATA = {"Software": None, "Title": None, "Author": None, "Description": None, "Creation Time": None}


def plot_curves(arms: Sequence[Arm], tags: Sequence[str], title: str, path: Path) -> None:
    """One row per tag, one column per x axis; deterministic PNG bytes."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    rc = {"figure.dpi": 100, "savefig.dpi": 100, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3,
          "path.simplify": False, "svg.hashsalt": "grpo-lightning"}  # fmt: skip
    colors = [matplotlib.colormaps["tab10"](i % 10) for i in range(len(arms))]
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


def _notes_section(doc: Doc, confidence: float) -> None:
    doc.h(2, "Method")
    doc.items(
        [
            "Runs of one arm differ only in their seed; each finished run counts once (unfinished runs are left out).",
            "Final metric: the last value logged by the run; for val/* the last validation.",
            f"Confidence interval: mean ± t({(1 + confidence) / 2:g}, n − 1) · s / √n with s the sample standard deviation.",
            "Welch's t-test: t = (mean A − mean B) / √(s²A/nA + s²B/nB), Welch-Satterthwaite degrees of freedom, two-sided p.",
            "Training step: a step that ended in a policy update and logged training metrics (DAPO's dynamic "
            "sampling can spend several rollout batches on one); generated tokens are cumulative.",
        ]
    )


# ---------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="grpo-lightning-report",
        description="Markdown/HTML report with statistics and learning curves of a grpo-lightning-ablate sweep.",
    )
    parser.add_argument("sweep_dir", type=Path, help="the sweep's output_dir (one folder per cell)")
    parser.add_argument("--name", default=None, help="report name (default: the sweep folder's name)")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="parent folder of the report (default: reports/)")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence level of the intervals")
    parser.add_argument(
        "--provenance", action="append", default=[], metavar="LINE",
        help="a line for the Provenance section (command, commit, machine); repeatable",
    )
    args = parser.parse_args(argv)
    if not 0 < args.confidence < 1:
        parser.error("--confidence must be between 0 and 1")
    if not args.sweep_dir.is_dir():
        parser.error(f"{args.sweep_dir} is not a directory")
    target = build_report(args.sweep_dir, args.out, args.name, args.confidence, args.provenance)
    print(f"report: {target / 'report.md'}")
    print(f"html:   {target / 'report.html'}")


if __name__ == "__main__":
    main()
