"""The sweep spec (``configs/ablation/*.yaml``, documented in ``grpo_lightning.ablation.run``):
its validation, its cells (variant x seed x override values) and the YAML files it names."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import product
from pathlib import Path
from typing import Any

from grpo_lightning.cli.resources import config_dir, resolve_config, shipped_config

WARMSTART = "warmstart"
#: The override axis whose values are YAML files (or lists of them) added after ``base_configs``:
#: ``overrides: {config: [null, schedules/cosine_kl.yaml]}`` compares a setting with and without them.
CONFIG_AXIS = "config"

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
    "baseline",
    "cell",
}
#: Seeds of a sweep that names none: five, so that paired tests have some power.
DEFAULT_SEEDS = [0, 1, 2, 3, 4]


class SweepError(ValueError):
    """An invalid sweep spec, raised before any cell runs."""


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"model": {"kl": {"beta": [0, 1]}}, "data.x": 2}`` -> ``{"model.kl.beta": [0, 1], "data.x": 2}``.

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
        return self.label + self._config_part() + "".join(f"-{part}" for part in self._override_parts())

    @property
    def name(self) -> str:
        return "-".join([self.label + self._config_part(), f"seed{self.seed}", *self._override_parts()])

    def config_files(self) -> list[str]:
        """The YAML files of the ``config`` axis, as given."""
        return config_files(dict(self.overrides).get(CONFIG_AXIS))

    def _config_part(self) -> str:
        """``+cosine_kl`` for the ``config`` axis' files (nothing without them)."""
        return "".join(f"+{_label_value(Path(f).stem)}" for f in self.config_files())

    def _override_parts(self) -> list[str]:
        others = [(k, v) for k, v in self.overrides if k != CONFIG_AXIS]
        shorts = _short_names([k for k, _ in others])
        return [f"{shorts[key]}{_label_value(value)}" for key, value in others]

    def identity(self) -> dict[str, Any]:
        return {"variant": self.variant, "seed": self.seed, "overrides": dict(self.overrides)}

    def __hash__(self) -> int:
        # an axis value may be a list (the config axis' files), which the generated hash refuses;
        # equal cells have the same name
        return hash(self.name)


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
    #: The arm every other arm is compared with in the report (default: the first cell's arm).
    baseline: str | None = None
    #: The one cell a launcher's job runs (``launch``); ``None`` outside those jobs.
    cell: str | None = None
    #: The spec's whole ``variants`` list, where a job of a ``-m variant=...`` multirun narrowed
    #: ``variants`` to its one: the sweep's baseline comes from it, the same in every job.
    sweep_variants: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SweepSpec:
        raw = _plain(raw)
        raw.pop("hydra", None)
        unknown = sorted(set(raw) - SPEC_KEYS)
        if unknown:
            raise SweepError(f"unknown sweep spec keys {unknown}; known keys: {sorted(SPEC_KEYS)}.")
        if not raw.get("output_dir"):
            raise SweepError("output_dir: give the directory that will hold one folder per cell.")

        variants = sweep_variants = _as_list(raw.get("variants"), "variants")
        if raw.get("variant") is not None:  # a job of a `-m variant=...` multirun: its one variant
            variants = [str(raw["variant"])]
        if not variants:
            raise SweepError("variants: name at least one of configs/variant/*.yaml (e.g. [grpo, dapo]).")
        seeds = _as_list(raw.get("seeds", DEFAULT_SEEDS), "seeds")
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
        for value in overrides.get(CONFIG_AXIS, []):
            for path in config_files(value):
                resolve_path(path, f"overrides.{CONFIG_AXIS}")
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
                raise SweepError(f"{key!r} is not a dotted CLI key such as 'model.kl.beta'.")

        parallel = int(raw.get("parallel") or 1)
        if parallel < 1:
            raise SweepError(f"parallel: must be at least 1 (got {parallel}).")
        base_configs = [resolve_path(p, "base_configs") for p in _as_list(raw.get("base_configs"), "base_configs")]
        model = raw.get("model")
        spec = cls(
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
            baseline=None if raw.get("baseline") is None else str(raw["baseline"]),
            cell=None if raw.get("cell") is None else str(raw["cell"]),
            sweep_variants=[str(v) for v in sweep_variants],
        )
        arms = spec.sweep_arms() if spec.baseline is not None else []
        if spec.baseline is not None and spec.baseline not in arms:
            raise SweepError(f"baseline: {spec.baseline!r} is not an arm of the sweep; give one of {arms}.")
        return spec

    def settings(self, cell: Cell) -> dict[str, Any]:
        """What a finished cell's results depend on besides its identity; a rerun of the sweep
        with other settings must not reuse it. Config files are recorded by path and by content (an
        edited ``configs/variant/dapo.yaml`` is another setting under the same name)."""
        settings = {
            "variant_config": portable_path(variant_config(cell.variant)),
            "variant_config_sha256": file_digest(variant_config(cell.variant)),
            "base_configs": [portable_path(p) for p in self.base_configs],
            "base_configs_sha256": [file_digest(p) for p in self.base_configs],
            "args": self.args,
            "overrides": dict(cell.overrides),
            "model": self.model,
            "warmstart": self.warmstart if self.model == WARMSTART else None,
            "validate_before_training": self.validate_before_training,
        }
        return json.loads(json.dumps(settings, sort_keys=True, default=str))

    def sweep_arms(self) -> list[str]:
        """The arms of the whole sweep: those of the spec's ``variants`` list, then, in a ``-m variant=...``
        job whose variant the list lacks, the job's own."""
        labels: dict[str, str] = {}
        for variant in [*self.sweep_variants, *self.variants]:
            labels.setdefault(Cell(variant, 0).label, variant)  # a variant once, by its name or its file
        variants = list(labels.values())
        return list(dict.fromkeys(cell.arm for cell in replace(self, variants=variants).cells()))

    def baseline_arm(self) -> str:
        """The arm the report compares every other arm with: ``baseline``, else the first arm of
        the whole sweep (not of the one variant a ``-m variant=...`` job runs)."""
        return self.baseline or self.sweep_arms()[0]

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
    """A YAML file relative to the working directory, else a shipped config of that name
    (``configs/trainer/cpu.yaml`` works from a clone and from an installed package alike)."""
    try:
        return resolve_config(path)
    except FileNotFoundError as error:
        raise SweepError(f"{field_name}: {error}") from None


def file_digest(path: str | Path) -> str | None:
    """The first 16 hex digits of the SHA-256 of a config file's bytes; ``None`` where it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def portable_path(path: str | Path) -> str:
    """A config file as a cell's settings record it: ``configs/...`` for a shipped config, else
    relative to the working directory where it is inside it, so that the record still matches
    when the sweep resumes from another checkout of the same tree; else the absolute path."""
    path = Path(path).absolute()
    for root, prefix in ((config_dir().absolute(), "configs"), (Path.cwd().absolute(), None)):
        if root in path.parents:
            relative = path.relative_to(root).as_posix()
            return f"{prefix}/{relative}" if prefix else relative
    return path.as_posix()


def config_files(value: Any) -> list[str]:
    """The files one value of the ``config`` axis names: none (``null``/``none``), one, or a list."""
    if value is None or value == "none":
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def variant_config(variant: str) -> Path:
    """``grpo`` -> the shipped ``configs/variant/grpo.yaml``; a YAML path is taken as is."""
    if variant.endswith((".yaml", ".yml")):
        return resolve_path(variant, "variants")
    path = shipped_config(f"variant/{variant}.yaml")
    if path is None:
        known = sorted(p.stem for p in (config_dir() / "variant").glob("*.yaml"))
        raise SweepError(f"variants: no configs/variant/{variant}.yaml; known variants: {known}.")
    return path
