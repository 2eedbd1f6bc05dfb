"""``grpo-lightning-ablate``: sweeps of Lightning fit runs over variants, seeds and settings.

    grpo-lightning-ablate --config-name default
    grpo-lightning-ablate --config-name smoke output_dir=runs/ablation/try parallel=2
    grpo-lightning-ablate -m variant=grpo,dapo seed=0,1,2
    grpo-lightning-ablate ++overrides.model.beta=[0.0,0.04] args.trainer.max_steps=50

A sweep spec (``configs/ablation/*.yaml``) names the shared YAML files and the axes::

    name: default
    output_dir: runs/ablation/${name}
    base_configs: [configs/trainer/cpu.yaml, configs/data/arithmetic.yaml, configs/model/tiny.yaml]
    model: warmstart                  # a path / hub id, "warmstart", or null (from base_configs)
    warmstart: {}                     # keyword arguments of grpo_lightning.quickstart.warmstart.warm_start
    variants: [grpo, dr_grpo, dapo, rloo, gspo]   # names of configs/variant/*.yaml (or YAML paths)
    seeds: [0, 1, 2]
    overrides:                        # extra axes: dotted CLI key -> list of values
      model.group_size: [4, 8]
    args:                             # fixed CLI overrides of every cell
      trainer.max_steps: 100
    parallel: 1                       # cells run at once
    gpus: auto                        # handed out round-robin (CUDA_VISIBLE_DEVICES); none on CPU
    timeout_s: null                   # stop a cell after this many seconds (then it counts as failed)
    threads: auto                     # torch CPU threads per cell (auto: cores / parallel for CPU cells)
    validate_before_training: true    # val/* of the start model, logged before the first step
    variant: null                     # a single variant / seed (Hydra multirun sets these)
    seed: null

Every cell (variant x seed x override values) is one ``python -m grpo_lightning.cli fit`` in a
subprocess, built from the same YAML files as a hand-run ``grpo-lightning fit``::

    python -m grpo_lightning.cli fit --config configs/variant/<v>.yaml --config <base_configs...> \\
        --seed_everything <s> --trainer.logger.init_args.save_dir <cell dir> --model.model <path> \\
        --<args...> --<override key> <value>

A cell directory (e.g. ``grpo-seed0-group_size4``) holds ``cell.json`` (its identity and
command), ``train.log``, the TensorBoard events, the resolved ``config.yaml`` saved by
LightningCLI, ``metrics.json`` once the fit succeeded, and last a ``DONE`` marker. Running the
sweep again skips cells that have the marker and starts unfinished ones afresh; a finished cell
whose recorded settings (configs, args, overrides, model) differ from the spec's stops the sweep
before anything runs. ``grpo-lightning-report <output_dir>`` then compares the variants.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "configs" / "ablation"
VARIANT_CONFIG_DIR = REPO_ROOT / "configs" / "variant"

DONE_FILE = "DONE"
CELL_FILE = "cell.json"
METRICS_FILE = "metrics.json"
LOG_FILE = "train.log"
WARMSTART = "warmstart"

#: Keys of the sweep spec; anything else is a mistake worth reporting.
SPEC_KEYS = {
    "name",
    "output_dir",
    "base_configs",
    "model",
    "warmstart",
    "variants",
    "seeds",
    "overrides",
    "args",
    "parallel",
    "gpus",
    "variant",
    "seed",
    "validate_before_training",
    "python",
    "timeout_s",
    "threads",
}


class SweepError(ValueError):
    """An invalid sweep spec, raised before any cell runs."""


# ---------------------------------------------------------------------------- spec handling


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"model": {"beta": [0, 1]}, "data.x": 2}`` -> ``{"model.beta": [0, 1], "data.x": 2}``.

    Nested mappings and dotted keys mean the same; lists and scalars are leaves.
    """
    if not isinstance(tree, Mapping):
        return {prefix: tree} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


def cli_value(value: Any) -> str:
    """A value as LightningCLI (jsonargparse) reads it back: YAML/JSON scalars and lists."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(value, sort_keys=True)


def _label_value(value: Any) -> str:
    text = cli_value(value)
    text = re.sub(r"[^A-Za-z0-9.+_-]+", "_", text).strip("_")
    return text or "none"


@dataclass(frozen=True)
class Cell:
    """One fit run: a variant, a seed and one value per override axis."""

    variant: str
    seed: int
    overrides: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        """The variant as named in folders: a YAML path gives its file name without suffix."""
        if self.variant.endswith((".yaml", ".yml")):
            return _label_value(Path(self.variant).stem)
        return _label_value(self.variant)

    @property
    def arm(self) -> str:
        """The cell's name without the seed: what the report compares across seeds."""
        return "-".join([self.label, *(f"{short}{_label_value(v)}" for short, v in self._short_overrides())])

    @property
    def name(self) -> str:
        parts = [self.label, f"seed{self.seed}", *(f"{short}{_label_value(v)}" for short, v in self._short_overrides())]
        return "-".join(parts)

    def _short_overrides(self) -> list[tuple[str, Any]]:
        return [(_short_names([k for k, _ in self.overrides])[key], value) for key, value in self.overrides]

    def identity(self) -> dict[str, Any]:
        return {"variant": self.variant, "seed": self.seed, "overrides": dict(self.overrides)}


def _short_names(keys: Sequence[str]) -> dict[str, str]:
    """The last component of each dotted key, or more components where that is ambiguous."""
    names = {}
    for key in keys:
        parts = key.split(".")
        for depth in range(1, len(parts) + 1):
            short = "_".join(p for p in parts[-depth:] if p != "init_args")
            if sum(1 for other in keys if other != key and other.split(".")[-depth:] == parts[-depth:]) == 0:
                break
        names[key] = short.replace(".", "_")
    return names


@dataclass
class SweepSpec:
    """A validated sweep spec (see the module docstring)."""

    output_dir: Path
    base_configs: list[Path]
    variants: list[str]
    seeds: list[int]
    overrides: dict[str, list[Any]] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    warmstart: dict[str, Any] = field(default_factory=dict)
    parallel: int = 1
    gpus: Any = "auto"
    name: str = "ablation"
    validate_before_training: bool = True
    python: str = sys.executable
    timeout_s: float | None = None
    threads: Any = "auto"

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SweepSpec:
        raw = _plain(raw)
        raw.pop("hydra", None)
        unknown = sorted(set(raw) - SPEC_KEYS)
        if unknown:
            raise SweepError(f"unknown sweep spec keys {unknown}; known keys: {sorted(SPEC_KEYS)}.")
        if not raw.get("output_dir"):
            raise SweepError("output_dir: give the directory that will hold one folder per cell.")

        variants = _as_list(raw.get("variants"), "variants")
        if raw.get("variant") is not None:
            variants = [str(raw["variant"])]
        if not variants:
            raise SweepError("variants: name at least one of configs/variant/*.yaml (e.g. [grpo, dapo]).")
        seeds = _as_list(raw.get("seeds", [0]), "seeds")
        if raw.get("seed") is not None:
            seeds = [raw["seed"]]
        try:
            seeds = [int(s) for s in seeds]
        except (TypeError, ValueError) as error:
            raise SweepError(f"seeds: integers expected, got {seeds!r}.") from error
        if not seeds:
            raise SweepError("seeds: give at least one seed.")

        overrides = {}
        for key, values in flatten(raw.get("overrides") or {}).items():
            values = list(values) if isinstance(values, (list, tuple)) else [values]
            if not values:
                raise SweepError(f"overrides.{key}: give at least one value.")
            overrides[key] = values
        args = raw.get("args") or {}
        if isinstance(args, (list, tuple)):  # ["trainer.max_steps=5", ...]
            pairs = {}
            for item in args:
                key, sep, value = str(item).lstrip("-").partition("=")
                if not sep:
                    raise SweepError(f"args: {item!r} is not 'key=value'.")
                pairs[key] = value
            args = pairs
        args = flatten(args)
        for key in list(args) + list(overrides):
            if not key or key.startswith("-") or " " in key:
                raise SweepError(f"{key!r} is not a dotted CLI key such as 'model.beta'.")

        parallel = int(raw.get("parallel") or 1)
        if parallel < 1:
            raise SweepError(f"parallel: must be at least 1 (got {parallel}).")
        base_configs = [resolve_path(p, "base_configs") for p in _as_list(raw.get("base_configs"), "base_configs")]
        model = raw.get("model")
        return cls(
            output_dir=Path(str(raw["output_dir"])).expanduser().absolute(),
            base_configs=base_configs,
            variants=[str(v) for v in variants],
            seeds=seeds,
            overrides=overrides,
            args=args,
            model=None if model is None else str(model),
            warmstart=dict(raw.get("warmstart") or {}),
            parallel=parallel,
            gpus=raw.get("gpus", "auto"),
            name=str(raw.get("name") or "ablation"),
            validate_before_training=bool(raw.get("validate_before_training", True)),
            python=str(raw.get("python") or sys.executable),
            timeout_s=None if raw.get("timeout_s") is None else float(raw["timeout_s"]),
            threads=raw.get("threads", "auto"),
        )

    def settings(self, cell: Cell) -> dict[str, Any]:
        """What a finished cell's results depend on besides its identity; a rerun of the sweep
        with other settings must not reuse it."""
        settings = {
            "variant_config": str(variant_config(cell.variant)),
            "base_configs": [str(p) for p in self.base_configs],
            "args": self.args,
            "overrides": dict(cell.overrides),
            "model": self.model,
            "warmstart": self.warmstart if self.model == WARMSTART else None,
            "validate_before_training": self.validate_before_training,
        }
        return json.loads(json.dumps(settings, sort_keys=True, default=str))

    def cells(self) -> list[Cell]:
        keys = list(self.overrides)
        cells = [
            Cell(variant, seed, tuple(zip(keys, values)))
            for variant in self.variants
            for values in product(*(self.overrides[k] for k in keys))
            for seed in self.seeds
        ]
        names = [c.name for c in cells]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise SweepError(f"cells with the same directory name {duplicates}: make the axis values distinct.")
        return cells


def _plain(config: Mapping[str, Any]) -> dict[str, Any]:
    """A plain ``dict`` of a Hydra/OmegaConf config (interpolations resolved) or a mapping."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(config):
        return OmegaConf.to_container(config, resolve=True)
    return dict(config)


def _as_list(value: Any, name: str) -> list:
    if value is None:
        return []
    if isinstance(value, (str, int, float)):
        return [value]
    try:
        return list(value)
    except TypeError as error:
        raise SweepError(f"{name}: a list expected, got {value!r}.") from error


def resolve_path(path: str | Path, field_name: str) -> Path:
    """A YAML file relative to the working directory, else to the repository root."""
    candidate = Path(str(path)).expanduser()
    for option in (candidate, REPO_ROOT / candidate):
        if option.is_file():
            return option.absolute()
    raise SweepError(f"{field_name}: {path} is neither a file nor relative to {REPO_ROOT}.")


def variant_config(variant: str) -> Path:
    """``grpo`` -> ``configs/variant/grpo.yaml``; a YAML path is taken as is."""
    if variant.endswith((".yaml", ".yml")):
        return resolve_path(variant, "variants")
    path = VARIANT_CONFIG_DIR / f"{variant}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in VARIANT_CONFIG_DIR.glob("*.yaml"))
        raise SweepError(f"variants: no configs/variant/{variant}.yaml; known variants: {known}.")
    return path


def resolve_model(spec: SweepSpec) -> str | None:
    """The ``--model.model`` value of every cell; ``warmstart`` trains (or reuses) the tiny model once."""
    if spec.model != WARMSTART:
        return spec.model
    from grpo_lightning.quickstart.warmstart import warm_start

    logger.info("Resolving model: warmstart %s", spec.warmstart or "(defaults)")
    return str(warm_start(**spec.warmstart))


def cell_command(spec: SweepSpec, cell: Cell, cell_dir: Path, model: str | None) -> list[str]:
    """The fit command line of one cell."""
    command = [spec.python, "-m", "grpo_lightning.cli", "fit"]
    # The variant's class_path comes first: settings given before it would be bound to the base
    # class, whose defaults would then replace the variant's own (DAPO's beta, clip_eps_high).
    for path in [variant_config(cell.variant), *spec.base_configs]:
        command += ["--config", str(path)]
    command += [
        "--seed_everything", str(cell.seed),
        "--trainer.default_root_dir", str(cell_dir),
        "--trainer.logger.init_args.save_dir", str(cell_dir),
        "--trainer.logger.init_args.name", "",
        "--trainer.logger.init_args.version", "",
    ]  # fmt: skip
    if model is not None:
        command += ["--model.model", model]
    if spec.validate_before_training:
        command += ["--trainer.callbacks+=grpo_lightning.ablation.run.ValidateBeforeTraining"]
    for key, value in [*spec.args.items(), *cell.overrides]:
        command += [f"--{key}", cli_value(value)]
    return command


# ---------------------------------------------------------------------------- running


@dataclass
class CellResult:
    cell: Cell
    directory: Path
    status: str  # "skipped", "done" or "failed"
    seconds: float = 0.0
    message: str = ""


def is_done(cell_dir: Path) -> bool:
    return (cell_dir / DONE_FILE).is_file()


def _settings_changed(spec: SweepSpec, cell: Cell) -> bool:
    try:
        recorded = json.loads((spec.output_dir / cell.name / CELL_FILE).read_text()).get("settings")
    except (OSError, ValueError):
        return False
    return recorded is not None and recorded != spec.settings(cell)


def _devices(gpus: Any) -> list[str]:
    """Device ids to hand out round-robin; none on a CPU machine."""
    if gpus in (None, False, "none", 0):
        return []
    if isinstance(gpus, (list, tuple)):
        return [str(g) for g in gpus]
    if isinstance(gpus, int):
        return [str(i) for i in range(gpus)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d for d in visible.split(",") if d.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU")]


def _threads_per_cell(threads: Any, parallel: int, on_gpus: bool) -> int | None:
    """CPU threads of each cell's torch: ``auto`` shares the cores among parallel CPU cells
    (oversubscribed torch threads spin and slow every cell down); ``None`` leaves torch's default."""
    if threads is None or threads == "none":
        return None
    if threads != "auto":
        if int(threads) < 1:
            raise SweepError(f"threads: must be at least 1, auto or null (got {threads}).")
        return int(threads)
    if "OMP_NUM_THREADS" in os.environ or on_gpus or parallel == 1:
        return None
    return max(1, (os.cpu_count() or 1) // parallel)


def run_cell(spec: SweepSpec, cell: Cell, model: str | None, env: Mapping[str, str] | None = None) -> CellResult:
    """Run one cell from scratch in a subprocess; ``metrics.json`` then ``DONE`` on success."""
    cell_dir = spec.output_dir / cell.name
    if cell_dir.exists():
        shutil.rmtree(cell_dir)
    cell_dir.mkdir(parents=True)
    command = cell_command(spec, cell, cell_dir, model)
    record = {**cell.identity(), "name": cell.name, "arm": cell.arm, "command": command, "settings": spec.settings(cell)}
    (cell_dir / CELL_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    logger.info("cell %s: starting", cell.name)
    started = time.perf_counter()
    with open(cell_dir / LOG_FILE, "w") as log:
        returncode = launch(command, log, env, spec.timeout_s)
    seconds = time.perf_counter() - started
    if returncode != 0:
        tail = (cell_dir / LOG_FILE).read_text(errors="replace").strip().splitlines()[-5:]
        message = f"exit status {returncode}; see {cell_dir / LOG_FILE}: " + " | ".join(tail)
        logger.error("cell %s failed: %s", cell.name, message)
        return CellResult(cell, cell_dir, "failed", seconds, message)
    metrics = summarize_cell(cell_dir, wall_time_s=seconds)
    (cell_dir / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    (cell_dir / DONE_FILE).write_text("")
    logger.info("cell %s: done in %.1f s", cell.name, seconds)
    return CellResult(cell, cell_dir, "done", seconds)


def launch(command: Sequence[str], log, env: Mapping[str, str] | None, timeout_s: float | None = None) -> int:
    """Run the fit subprocess with its output in ``log``; its exit status (124 after a timeout)."""
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    process = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, env=full_env)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        log.write(f"\n[grpo-lightning-ablate] stopped after the cell timeout of {timeout_s} s\n")
        return 124
    except BaseException:
        process.kill()
        process.wait()
        raise


def run_sweep(spec: SweepSpec | Mapping[str, Any]) -> list[CellResult]:
    """Run every unfinished cell of ``spec`` (sequentially, or ``parallel`` at a time)."""
    if not isinstance(spec, SweepSpec):
        spec = SweepSpec.from_dict(spec)
    cells = spec.cells()
    for cell in cells:
        variant_config(cell.variant)  # fail on a misspelt variant before any work
    spec.output_dir.mkdir(parents=True, exist_ok=True)
    results: dict[Cell, CellResult] = {}
    todo = []
    changed = [cell.name for cell in cells if is_done(spec.output_dir / cell.name) and _settings_changed(spec, cell)]
    if changed:
        raise SweepError(
            f"finished cells in {spec.output_dir} were run with other settings: {changed}. Give the sweep "
            "another output_dir, or delete these folders to run them again."
        )
    for cell in cells:
        if is_done(spec.output_dir / cell.name):
            logger.info("cell %s: done before, skipped", cell.name)
            results[cell] = CellResult(cell, spec.output_dir / cell.name, "skipped")
        else:
            todo.append(cell)
    if todo:
        model = resolve_model(spec)
        devices = _devices(spec.gpus)
        threads = _threads_per_cell(spec.threads, spec.parallel, bool(devices))
        slots: queue.Queue[int] = queue.Queue()
        for slot in range(spec.parallel):
            slots.put(slot)
        lock = threading.Lock()

        def work(cell: Cell) -> CellResult:
            slot = slots.get()
            try:
                env = {"CUDA_VISIBLE_DEVICES": devices[slot % len(devices)]} if devices else {}
                if threads is not None:
                    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
                result = run_cell(spec, cell, model, env)
            finally:
                slots.put(slot)
            with lock:
                results[cell] = result
            return result

        if spec.parallel == 1:
            for cell in todo:
                work(cell)
        else:
            with ThreadPoolExecutor(max_workers=spec.parallel) as pool:
                list(pool.map(work, todo))
    ordered = [results[c] for c in cells]
    counts = {s: sum(r.status == s for r in ordered) for s in ("done", "skipped", "failed")}
    logger.info("sweep %s: %d done, %d skipped, %d failed -> %s", spec.name, counts["done"], counts["skipped"], counts["failed"], spec.output_dir)
    return ordered


# ---------------------------------------------------------------------------- per-cell metrics


def summarize_cell(cell_dir: Path, wall_time_s: float | None = None) -> dict[str, Any]:
    """``metrics.json`` of a finished cell: the last value of every scalar and a few totals."""
    from grpo_lightning.report import load_run

    run = load_run(cell_dir)
    final = {tag: series.values[-1] for tag, series in sorted(run.scalars.items()) if len(series.values)}
    summary: dict[str, Any] = {
        "final": {k: _finite(v) for k, v in final.items()},
        "final_step": {tag: int(series.steps[-1]) for tag, series in sorted(run.scalars.items()) if len(series.steps)},
        "val/accuracy_before": _finite(run.initial.get("val/accuracy")),
        "generated_tokens": _finite(final.get("perf/generated_tokens")),
        "training_steps": int(len(run.update_steps)),
        "rollout_batches": int(run.update_steps[-1] + 1) if len(run.update_steps) else 0,
        "train_time_s": _finite(run.train_time_s),
        "wall_time_s": None if wall_time_s is None else round(wall_time_s, 3),
    }
    return summary


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


# ---------------------------------------------------------------------------- Lightning callback


def _make_validate_before_training():
    from lightning.pytorch.callbacks import Callback

    class ValidateBeforeTraining(Callback):
        """Run the validation loop once before the first training step, so ``val/*`` has a
        value for the untrained model (logged at step 0, before any training metric)."""

        def on_train_start(self, trainer, pl_module) -> None:
            if trainer.global_step > 0:  # resumed from a checkpoint: the untrained model is gone
                return
            loop = trainer.fit_loop.epoch_loop.val_loop
            trainer.validating = True
            loop.run()
            trainer.training = True

    ValidateBeforeTraining.__module__ = __name__
    ValidateBeforeTraining.__qualname__ = "ValidateBeforeTraining"
    return ValidateBeforeTraining


def __getattr__(name: str):
    # The callback class is built on first use, so that the sweep runner does not import Lightning.
    if name == "ValidateBeforeTraining":
        cls = _make_validate_before_training()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------- entry point


def sweep_from_config(cfg: Any) -> list[CellResult]:
    """Run the sweep described by a Hydra/OmegaConf config (or a plain mapping)."""
    results = run_sweep(SweepSpec.from_dict(cfg))
    failed = [r for r in results if r.status == "failed"]
    for result in failed:
        print(f"FAILED {result.cell.name}: {result.message}", file=sys.stderr)
    if failed:
        raise SystemExit(1)
    return results


def main() -> None:
    """Hydra entry point: ``grpo-lightning-ablate [--config-name NAME] [-m] [key=value ...]``."""
    import hydra

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    app = hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="default")(sweep_from_config)
    app()


if __name__ == "__main__":
    main()
