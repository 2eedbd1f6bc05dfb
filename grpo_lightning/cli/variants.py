"""The presets by short name on the command line: ``--model DAPO``, ``--model dapo`` and
``--model.help DAPO`` work wherever the class path ``grpo_lightning.variants.DAPO`` does, and
``fit --help`` lists them.

jsonargparse resolves a class name to a subclass it has seen imported, so the presets of the registry
(``grpo_lightning.variants.PRESETS``) are imported before parsing; a short name (``dapo``, ``dr_grpo``)
is made its class path, and a former class path (``variants.DAPO``) is refused naming the new one
(in a config file, the parse error says so: :mod:`grpo_lightning.cli.user_errors`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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


def restore_variant_defaults(variant: type, init_args: Any, given_keys: Callable[[], Sequence[str] | None]) -> list[str]:
    """Put back into ``init_args`` the defaults of ``variant`` (DAPO's ``kl.beta`` 0, ``loss.clip_eps_high``
    0.28) that the base class's replaced: settings given before the variant is named (``--model.model M
    --model dapo``, a config of ``model.init_args`` before ``variant/dapo.yaml``) are read against the base
    class, whose defaults jsonargparse fills in then and keeps. A field the user gave (``given_keys``: the
    model keys given, parsed without defaults; called only where a value looks replaced) is kept. Returns
    the fields restored, dotted (``kl.beta``)."""
    import dataclasses
    import inspect

    from grpo_lightning.training.module import GroupPolicyOptimization

    base = inspect.signature(GroupPolicyOptimization).parameters
    replaced = []
    for name, parameter in inspect.signature(variant).parameters.items():
        default = parameter.default
        base_default = base[name].default if name in base else inspect.Parameter.empty
        if inspect.Parameter.empty in (default, base_default) or default == base_default or not hasattr(init_args, "get"):
            continue
        if dataclasses.is_dataclass(default) and dataclasses.is_dataclass(base_default):
            pairs = [(f"{name}.{f.name}", getattr(default, f.name), getattr(base_default, f.name))
                     for f in dataclasses.fields(default)]  # fmt: skip
        else:
            pairs = [(name, default, base_default)]
        replaced += [(key, own) for key, own, theirs in pairs if own != theirs and init_args.get(key) == theirs]
    if not replaced:
        return []
    given = [key.removeprefix("init_args.") for key in (given_keys() or ())]
    restored = []
    for key, own in replaced:
        if not any(g == key or key.startswith(g + ".") or g.startswith(key + ".") for g in given):
            init_args[key] = own
            restored.append(key)
    return restored


def apply_variant_defaults(config: Any, parser: Any, raw_args: Sequence[str], subcommand: str | None) -> None:
    """A fit of a variant trains with its own defaults wherever the user set nothing, however the
    settings and the variant were ordered (:func:`restore_variant_defaults`); says which it put back.
    A resumed fit takes the checkpoint's settings instead."""
    from grpo_lightning.cli.resume_settings import given_model_keys

    model = config.get("model") or {}
    class_path = model.get("class_path") if hasattr(model, "get") else None
    if subcommand not in ("fit", None) or not class_path or config.get("ckpt_path"):  # None: a CLI made with run=False
        return
    module_name, _, name = class_path.rpartition(".")
    variant = getattr(importlib.import_module(module_name), name)
    restored = restore_variant_defaults(variant, model.get("init_args"),
                                        lambda: given_model_keys(parser, raw_args, subcommand))  # fmt: skip
    if restored:
        values = ", ".join(f"model.{key} {model.get('init_args').get(key)!r}" for key in restored)
        print(f"model: {name}'s own defaults apply ({values}): the settings given before {name} was named were read "
              "with the base class's.", file=sys.stderr, flush=True)  # fmt: skip
