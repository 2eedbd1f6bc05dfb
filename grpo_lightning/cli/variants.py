"""The shipped variants by short name on the command line: ``--model DAPO``, ``--model dapo`` and
``--model.help DAPO`` work wherever the class path ``variants.DAPO`` does, and ``fit --help`` lists them.

jsonargparse resolves a class name to a subclass it has seen imported, so the variants named by the
shipped ``configs/variant/*.yaml`` are imported by class path (the package never imports ``variants``
statically); a config's name (``dapo``, ``dr_grpo``) is made its class path before parsing.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path

import yaml

from grpo_lightning.cli.resources import config_dir

#: Options that take a variant: its class path, class name or config name.
VARIANT_FLAGS = ("--model", "--model.help")


def shipped_variants() -> dict[str, str]:
    """``{config name: class path}`` of the shipped variants (``{"dapo": "variants.DAPO", ...}``),
    read from ``configs/variant/*.yaml``."""
    found = {}
    for path in sorted((config_dir() / "variant").glob("*.yaml")):
        model = (yaml.safe_load(path.read_text()) or {}).get("model") or {}
        if model.get("class_path"):
            found[path.stem] = model["class_path"]
    return found


def register_shipped_variants() -> list[str]:
    """Import the shipped variants, so jsonargparse resolves their class names and lists them as the
    known subclasses of ``--model``; returns the class paths that imported (none without ``variants``)."""
    imported = []
    for class_path in shipped_variants().values():
        module_name, _, name = class_path.rpartition(".")
        try:
            getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError):
            continue
        imported.append(class_path)
    return imported


def resolve_variant_args(args: Sequence[str]) -> list[str]:
    """``args`` with the config name given to ``--model`` or ``--model.help`` (``dapo``) made its class
    path (``variants.DAPO``); anything else, and a file of that name, is left as it is."""
    names = shipped_variants()
    resolved = list(args)
    for i, arg in enumerate(resolved):
        flag, sep, value = arg.partition("=")
        if flag not in VARIANT_FLAGS:
            continue
        at = i if sep else i + 1
        if not sep:
            if at >= len(resolved):
                continue
            value = resolved[at]
        if value in names and not Path(value).exists():
            resolved[at] = f"{flag}={names[value]}" if sep else names[value]
    return resolved


def describe_model_option(parser) -> None:
    """Say in ``parser``'s ``--help``, at its top and over its ``--model`` group, which variants
    ``--model`` takes and where each one's options are listed."""
    names = shipped_variants()
    classes = ", ".join(path.rpartition(".")[2] for path in names.values())
    text = (
        f"The algorithm: --model NAME, one of {classes} (or its config name: {', '.join(names)}), or a "
        "subclass's import path; --model.help NAME lists a variant's options (--model.kl.beta 0.0, ...)"
    )
    parser.description = f"{parser.description or ''} {text}.".strip()
    for group in parser._action_groups:
        if any("--model" in action.option_strings for action in group._group_actions):
            group.description = text
