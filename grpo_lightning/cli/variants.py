"""The presets by short name on the command line: ``--model DAPO``, ``--model dapo`` and
``--model.help DAPO`` work wherever the class path ``grpo_lightning.variants.DAPO`` does, and
``fit --help`` lists them.

jsonargparse resolves a class name to a subclass it has seen imported, so the presets of the registry
(``grpo_lightning.variants.PRESETS``) are imported before parsing; a short name (``dapo``, ``dr_grpo``)
is made its class path, and a former class path (``variants.DAPO``) is refused naming the new one
(in a config file, the parse error says so: :mod:`grpo_lightning.cli.user_errors`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from grpo_lightning import variants
from grpo_lightning.cli.user_errors import moved_class_path_message
from grpo_lightning.errors import ConfigError

#: Options that take a variant: its class path, class name or short name.
VARIANT_FLAGS = ("--model", "--model.help")


def shipped_variants() -> dict[str, str]:
    """``{short name: class path}`` of the presets (``{"grpo": "grpo_lightning.variants.GRPO", ...}``),
    in the registry's order."""
    return {name: variants.class_path(name) for name in variants.PRESETS}


def register_shipped_variants() -> list[str]:
    """Import the presets, so jsonargparse resolves their class names and lists them as the known
    subclasses of ``--model``; returns their class paths."""
    for class_name in variants.PRESETS.values():
        getattr(variants, class_name)
    return list(shipped_variants().values())


def resolve_variant_args(args: Sequence[str]) -> list[str]:
    """``args`` with the short name given to ``--model`` or ``--model.help`` (``dapo``) made its class
    path (``grpo_lightning.variants.DAPO``); anything else, and a file of that name, is left as it is.
    A class path whose module has moved (``variants.DAPO``) raises :class:`ConfigError` naming where it is."""
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
        elif moved := moved_class_path_message(value):
            raise ConfigError(moved)
    return resolved


def describe_model_option(parser) -> None:
    """Say in ``parser``'s ``--help``, at its top and over its ``--model`` group, which variants
    ``--model`` takes and where each one's options are listed."""
    names = shipped_variants()
    classes = ", ".join(path.rpartition(".")[2] for path in names.values())
    text = (
        f"The algorithm: --model NAME, one of {classes} (or its short name: {', '.join(names)}), or a "
        "subclass's import path; --model.help NAME lists a variant's options (--model.kl.beta 0.0, ...)"
    )
    parser.description = f"{parser.description or ''} {text}.".strip()
    for group in parser._action_groups:
        if any("--model" in action.option_strings for action in group._group_actions):
            group.description = text
