"""What a sweep checks before any cell runs, so that each cell runs what its name says.

The variant's YAML comes first on a cell's command line (jsonargparse binds later settings to the
class it names), so a shared ``base_configs`` file that also sets ``model.class_path`` would
replace every arm's variant, silently. A base config (or a file of the ``config`` axis) is
therefore refused when it sets what the ``variants`` axis sets (the model's class and the variant
files' own settings) or the data order's seed (the ``seeds`` axis). What the other axes set comes
after every file on the command line, so there the axis wins, and says so in the sweep's log:
``seed_everything`` and each key of ``overrides``. Then each cell's command line is parsed as
``grpo-lightning fit`` parses it, and the resolved class, seed and axis values are compared with
the cell's label; so are the settings that make its variant what it is (:func:`variant_settings`:
DAPO's ``loss.clip_eps_high`` 0.28, Dr. GRPO's aggregation), which only an axis may change.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from grpo_lightning import variants
from grpo_lightning.ablation.spec import CONFIG_AXIS, Cell, SweepError, SweepSpec, cli_value, flatten
from grpo_lightning.ablation.spec import config_files, resolve_path, variant_config

CLASS_KEY = "model.class_path"
DATA_SEED_KEY = "data.seed"


def canonical(key: str) -> str:
    """``model.init_args.kl.beta`` and ``model.kl.beta`` name the same setting: ``model.kl.beta``."""
    return ".".join(part for part in key.split(".") if part != "init_args")


def yaml_settings(path: Path) -> dict[str, Any]:
    """The settings a YAML file makes, by canonical dotted key (``model: <class path>`` sets ``model.class_path``)."""
    loaded = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(loaded, Mapping):
        return {}
    loaded = dict(loaded)
    if isinstance(loaded.get("model"), str):
        loaded["model"] = {"class_path": loaded["model"]}
    return {canonical(key): value for key, value in flatten(loaded).items()}


def variant_class(variant: str) -> str:
    """The ``model.class_path`` of a variant's YAML file; a variant file must name one."""
    path = variant_config(variant)
    class_path = yaml_settings(path).get(CLASS_KEY)
    if not class_path:
        raise SweepError(f"variants: {path} sets no model.class_path; a variant's file names its class "
                         "(e.g. grpo_lightning.variants.GRPO).")
    return str(class_path)


def same_class(a: str, b: str) -> bool:
    """Whether two class paths name one class (``grpo_lightning.variants.DAPO`` and
    ``grpo_lightning.variants.dapo.DAPO`` do). A preset's former path (``variants.DAPO``, in the
    configurations that runs before 0.1.0 saved) names the preset it named then."""
    a, b = (variants.moved_class_path(path) or path for path in (a, b))
    if a == b:
        return True
    try:
        return _import(a) is _import(b)
    except (ImportError, AttributeError, ValueError):
        return False  # not importable here: only the same path is known to be the same class


def _import(class_path: str) -> Any:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def refused_keys(spec: SweepSpec) -> dict[str, str]:
    """Canonical key -> the axis that sets it, for the settings a shared file may not make: the
    model settings of the ``variants`` axis (its file comes first, so a later file would win) and
    the data order's seed."""
    keys = {CLASS_KEY: "variants", DATA_SEED_KEY: "seeds"}
    for variant in spec.variants:
        for key in yaml_settings(variant_config(variant)):
            if key.startswith("model."):
                keys.setdefault(key, "variants")
    return keys


def _fix(key: str, axis: str) -> str:
    if key == CLASS_KEY:
        return "remove model.class_path from it (the variants axis gives each cell its class)"
    if axis == "seeds":
        return "remove it from that file (each cell's seed sets the data order)"
    return "remove it from that file (the variant's own file sets it for its cells)"


def shared_files(spec: SweepSpec) -> list[tuple[str, Path]]:
    """``(field, path)`` of each YAML file every cell (or every cell of a ``config`` value) shares."""
    files = [("base_configs", path) for path in spec.base_configs]
    for value in spec.overrides.get(CONFIG_AXIS, []):
        files += [(f"overrides.{CONFIG_AXIS}", resolve_path(f, f"overrides.{CONFIG_AXIS}")) for f in config_files(value)]
    return files


def check_shared_files(spec: SweepSpec) -> list[str]:
    """Refuse a base config, a ``config``-axis file or an ``args`` entry that sets what the
    ``variants`` or ``seeds`` axis sets; return a line for each setting of a file that an axis
    given on the command line replaces (``seed_everything``, the keys of ``overrides``)."""
    refused = refused_keys(spec)
    replaced = {canonical(key): f"overrides.{key}" for key in spec.overrides if key != CONFIG_AXIS}
    replaced["seed_everything"] = "seeds"
    notes = []
    for field, path in shared_files(spec):
        for key, value in yaml_settings(path).items():
            if key in refused:
                raise SweepError(
                    f"{field}: {path} sets {key} ({cli_value(value)}), which the {refused[key]} axis sets for "
                    f"each cell; {_fix(key, refused[key])}."
                )
            if key in replaced:
                notes.append(f"{replaced[key]} replaces {key} ({cli_value(value)}) of {path} in every cell")
    for key, value in spec.args.items():
        setting = CLASS_KEY if canonical(key) == "model" and isinstance(value, str) else canonical(key)
        if setting == CLASS_KEY:
            raise SweepError(
                f"args: {key} ({cli_value(value)}) would make every cell that class; the variants axis sets it: "
                "remove it from args."
            )
        if setting in refused or setting == "seed_everything":  # args come after the seed on each command line
            axis = refused.get(setting, "seeds")
            raise SweepError(f"args: {key} ({cli_value(value)}) would set what the {axis} axis sets for each cell "
                             f"({'its seed' if axis == 'seeds' else 'its variant'}): remove it from args.")  # fmt: skip
    return notes


def check_cells(spec: SweepSpec, cells: Sequence[Cell], commands: Sequence[Sequence[str]]) -> list[Any]:
    """Parse each cell's fit command as ``grpo-lightning fit`` does and refuse a cell whose resolved
    class, seed or axis values differ from its label; return the resolved configs, one per cell.
    Cells run by another interpreter (``python``) are parsed by it, not here: the check is left out,
    with a warning, and nothing is returned."""
    if cells and os.path.abspath(spec.python) != os.path.abspath(sys.executable):  # another venv's python links here too
        warnings.warn(f"python: the cells run with {spec.python}, so their resolved configs are not checked "
                      "against their names here.", stacklevel=2)  # fmt: skip
        return []
    global _checking_parser
    configs = []
    for cell, command in zip(cells, commands):
        arguments = list(command[command.index("fit"):])
        _checking_parser, resolved = parse_fit_command(arguments, cell.name, _checking_parser)
        configs.append(resolved)
        expected = variant_class(cell.variant)
        got = str(resolved.get("model.class_path"))
        if not same_class(got, expected):
            raise SweepError(
                f"cell {cell.name}: its resolved model.class_path is {got}, not {expected} as its variant "
                f"{cell.variant!r} says; a file after the variant's sets model.class_path: remove it there."
            )
        if resolved.get("seed_everything") != cell.seed:
            seed = resolved.get("seed_everything")
            raise SweepError(f"cell {cell.name}: its resolved seed_everything is {seed}, not {cell.seed} as its name says.")
        for key, value in cell.overrides:
            if key == CONFIG_AXIS:
                continue
            found, got = lookup(resolved, key)
            if found and not _same_value(got, value):
                raise SweepError(
                    f"cell {cell.name}: its resolved {key} is {cli_value(got)}, not {cli_value(value)} as its name says."
                )
        check_variant_settings(spec, cell, resolved)
    return configs


#: The settings a variant names by a class attribute rather than by a constructor default, with the
#: registry of their names: ``None`` in the config stands for the attribute's value
#: (:func:`grpo_lightning.algorithms.hooks.resolve_parts`, ``GroupPolicyOptimization.__init__``).
PART_KEYS = {
    "model.advantage": ("default_advantage", "ADVANTAGES"),
    "model.aggregation": ("default_aggregation", "AGGREGATIONS"),
    "model.loss.surrogate": ("default_surrogate", "SURROGATES"),
    "model.kl.placement": ("default_kl_placement", "KL_PLACEMENTS"),
}

_class_settings: dict[type, dict[str, Any]] = {}


def class_settings(cls: type) -> dict[str, Any]:
    """Canonical key -> value of each ``model.*`` setting as ``cls`` alone gives it: its constructor's
    defaults as the CLI resolves them (a variant's ``loss=LossOptions(clip_eps_high=0.28)`` included)
    and its ``default_*`` parts (:data:`PART_KEYS`). Built once per class."""
    if cls not in _class_settings:
        from jsonargparse import ArgumentParser

        parser = ArgumentParser(exit_on_error=False)
        parser.add_class_arguments(cls, "model", fail_untyped=False)
        defaults = parser.get_defaults().as_dict()
        settings = {canonical(key): value for key, value in flatten(defaults).items()}
        for key, (attribute, _) in PART_KEYS.items():
            settings[key] = getattr(cls, attribute, None)
        _class_settings[cls] = settings
    return _class_settings[cls]


def variant_settings(variant: str) -> dict[str, Any]:
    """Canonical key -> value of the settings that make ``variant`` what it is: those its class
    (:func:`class_settings`, with its file's own settings on top) gives another value than the base
    module, ``GroupPolicyOptimization``, or that the base has not (DAPO's ``dynamic_sampling``).
    Empty when the class does not import here (its cells' parse says why)."""
    from grpo_lightning.training.module import GroupPolicyOptimization

    try:
        cls = _import(variant_class(variant))
    except (ImportError, AttributeError, ValueError):
        return {}
    own = dict(class_settings(cls))
    own.update((key, value) for key, value in yaml_settings(variant_config(variant)).items() if key != CLASS_KEY)
    base = class_settings(GroupPolicyOptimization)
    return {key: value for key, value in own.items()
            if key != "model.model" and (key not in base or not _same_value(base[key], value))}  # fmt: skip


def _same_setting(key: str, got: Any, own: Any) -> bool:
    if key in PART_KEYS:  # a part given by its registered name or its import path; None is the variant's own
        if got is None:
            return True
        import grpo_lightning.algorithms as parts

        try:
            got = getattr(parts, PART_KEYS[key][1]).resolve(got)
        except Exception:  # an unknown part: the cell's fit says so; it is not the variant's
            return False
    return _same_value(got, own)


def _covers(setting: str, key: str) -> bool:
    """Whether giving ``setting`` gives ``key`` (``model.loss`` gives ``model.loss.clip_eps_high``)."""
    return key == setting or key.startswith(setting + ".")


def check_variant_settings(spec: SweepSpec, cell: Cell, resolved: Any) -> None:
    """Refuse ``cell`` when a shared setting (a base config or ``args``) gives one of its variant's
    own settings (:func:`variant_settings`) another value: the arm would keep the variant's name and
    run something else. A setting of the cell's own axes (an ``overrides`` key, a file of the
    ``config`` axis) is in its name, and stays allowed."""
    labelled = [canonical(key) for key, _ in cell.overrides if key != CONFIG_AXIS]
    for path in cell.config_files():
        labelled += yaml_settings(resolve_path(path, f"overrides.{CONFIG_AXIS}"))
    for key, own in variant_settings(cell.variant).items():
        if any(_covers(setting, key) for setting in labelled):
            continue
        found, got = lookup(resolved, key)
        if not found or _same_setting(key, got, own):
            continue
        raise SweepError(
            f"arm {cell.arm}: {_given_by(spec, key)} sets {key} to {cli_value(got)}, and the variant {cell.variant!r} "
            f"has {cli_value(own)} there: its cells would run with {cli_value(got)} and still be called {cell.arm}. "
            f"Drop it from the shared settings, or set it per arm through an axis so that the arm's name says it "
            f"(overrides: {{{key}: [{cli_value(got)}]}}, or a file of overrides.{CONFIG_AXIS})."
        )


def _given_by(spec: SweepSpec, key: str) -> str:
    """Where the shared settings give ``key``: the last of the base configs and ``args`` that does."""
    where = "a base config or args"
    for path in spec.base_configs:
        if any(_covers(setting, key) for setting in yaml_settings(path)):
            where = f"base_configs: {path}"
    for setting in spec.args:
        if _covers(canonical(setting), key):
            where = f"args: {setting}"
    return where


#: The parser :func:`check_cells` built first, kept for the checks a launcher's jobs make in this process.
_checking_parser: Any = None


def lookup(resolved: Any, key: str) -> tuple[bool, Any]:
    """The resolved value of a dotted CLI key, with or without ``init_args``."""
    parts = key.split(".")
    for candidate in (key, ".".join([parts[0], "init_args", *parts[1:]])):
        try:
            value = resolved[candidate]
        except (KeyError, TypeError):
            continue
        return True, value.as_dict() if hasattr(value, "as_dict") else value
    return False, None


def _same_value(got: Any, expected: Any) -> bool:
    numbers = (int, float)
    if isinstance(got, numbers) and isinstance(expected, numbers) and not isinstance(got, bool) and not isinstance(expected, bool):
        return math.isclose(float(got), float(expected), rel_tol=1e-12, abs_tol=0.0)
    return cli_value(got) == cli_value(expected)


def parse_fit_command(arguments: list[str], name: str, cli: Any = None) -> tuple[Any, Any]:
    """``(cli, config)``: the configuration ``grpo-lightning fit`` resolves from ``arguments``
    (``["fit", ...]``), without instantiating anything; pass the ``cli`` back to parse the next
    command with the same parser (building it is the slow part)."""
    try:
        if cli is None:
            cli = _parse_only_cli(arguments)
        else:
            cli.parse_arguments(cli.parser, arguments)
    except Exception as error:  # the message grpo-lightning fit would print, on one line
        raise SweepError(f"cell {name}: its fit command does not parse: {parse_error_line(error)}") from None
    return cli, cli.config["fit"]


def parse_error_line(error: BaseException) -> str:
    """What ``grpo-lightning fit`` says of a parse error (:func:`grpo_lightning.cli.user_errors.user_error_message`),
    on one line; a missing required setting is named with where a sweep gives it."""
    from grpo_lightning.cli.user_errors import user_error_message

    texts = "\n".join(str(e) for e in (error, error.__cause__, error.__context__) if e is not None)
    required = re.search(r'Parser key "(\w+)".*?the following arguments are required: ([\w, ]+)', texts, re.S)
    if required is not None:
        group, names = required.groups()
        where = "the sweep's model: (a directory, a hub id or warmstart), or a base config" if names == "model" else "a base config or args"
        return f"{group}.{names} is required; give it in {where}."
    text = user_error_message(error, parsing=True) or str(error)
    return " ".join(line.strip() for line in text.splitlines() if line.strip()) or type(error).__name__


def _parse_only_cli(arguments: list[str]) -> Any:
    from grpo_lightning.cli.app import GRPOLightningCLI

    class ParseOnly(GRPOLightningCLI):
        def _set_seed(self) -> None:  # no global seeding in the sweep's own process
            pass

        def parse_arguments(self, parser: Any, args: Any) -> None:
            argv, sys.argv = sys.argv, sys.argv[:1]  # the sweep's own command line is not this command's
            try:
                super().parse_arguments(parser, args)
            finally:
                sys.argv = argv

        def before_instantiate_classes(self) -> None:
            pass

        def instantiate_classes(self) -> None:
            pass

        def after_instantiate_classes(self) -> None:
            pass

        def _add_instantiators(self) -> None:
            pass

        def _run_subcommand(self, subcommand: str) -> None:
            pass

    return ParseOnly(args=arguments, raise_parse_errors=True)
