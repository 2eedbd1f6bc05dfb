"""Checks of a parsed configuration that would otherwise fail only after the model has loaded: a
module that names no algorithm (the base class, when no variant config was given), and chat-message
prompts for a tokenizer without a chat template. They read the configuration, the first line of a
local JSON data file and the tokenizer's config files, never the weights."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

from grpo_lightning.algorithms.hooks import AlgorithmHooks
from grpo_lightning.cli.user_errors import variant_names
from grpo_lightning.data.files import split_files
from grpo_lightning.errors import ConfigError

#: The parts a module must name (``default_<part>``, ``--model.<part>``) unless it overrides their hook.
NAMED_PARTS = {"advantage": "advantages", "aggregation": "aggregate"}


def check_variant(variant: type, init_args: Any) -> None:
    """Raise :class:`ConfigError` when ``variant`` (with ``init_args``) names no advantage estimator or
    aggregation and computes none itself, as the base class does when no variant is given."""
    missing = [
        part for part, hook in NAMED_PARTS.items()
        if (init_args or {}).get(part) is None and getattr(variant, f"default_{part}") is None
        and getattr(variant, hook) is getattr(AlgorithmHooks, hook)
    ]  # fmt: skip
    if missing:
        options = " and ".join(f"--model.{part} NAME" for part in missing)
        raise ConfigError(
            f"model: {variant.__name__} names no {' and no '.join(missing)}; give a variant, e.g. --model GRPO or "
            f"--config configs/variant/grpo.yaml (one of {', '.join(n.rpartition('.')[2] for n in variant_names())}), "
            f"or {options}."
        )


def check_chat_prompts(model_args: Any, data_args: Any) -> None:
    """Raise :class:`ConfigError` when the data's first prompt is chat messages and the tokenizer
    (a local directory) has no chat template to render them; multi-turn environments join messages
    themselves, and data that is not a local JSON file is checked when it is read."""
    model_args, data_args = model_args or {}, data_args or {}
    if model_args.get("environment") is not None or not data_args.get("path"):
        return
    prompt = first_value(str(data_args["path"]), data_args.get("prompt_column") or "prompt")
    policy = model_args.get("policy") or {}
    source = policy.get("tokenizer") or model_args.get("model")
    if not isinstance(prompt, list) or source is None or has_chat_template(str(source)) is not False:
        return
    raise ConfigError(
        f"data.path: its prompts are chat messages and the tokenizer of {source!r} has no chat template to render "
        "them; give --model.policy.tokenizer one that has (an instruct model's), or plain-text prompts."
    )


def first_value(path: str, column: str) -> Any:
    """``column`` of the first row of a local ``.jsonl``/``.json`` file (or a folder's train file); ``None``
    where there is no such file or row."""
    if os.path.isdir(path):
        path = split_files(path).get("train", "")
    if Path(path).suffix.lower() not in (".jsonl", ".json") or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as file:
            line = next((line for line in file if line.strip()), "")
        row = json.loads(line)
    except (OSError, UnicodeDecodeError, ValueError):
        return None  # the data module reports a file it cannot read
    return row.get(column) if isinstance(row, dict) else None


def has_chat_template(source: str) -> bool | None:
    """Whether the tokenizer in the local directory ``source`` has a chat template; ``None`` when
    ``source`` is not a local directory (a hub id, a GGUF file)."""
    folder = Path(source).expanduser()
    if not folder.is_dir():
        return None
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return bool(config.get("chat_template"))


def check_config(config: Any, subcommand: str | None) -> None:
    """The checks above on the parsed configuration of ``subcommand`` (the algorithm only for ``fit``)."""
    model = config.get("model") or {}
    data = config.get("data") or {}
    class_path = model.get("class_path")
    if subcommand == "fit" and class_path:
        module_name, _, name = class_path.rpartition(".")
        check_variant(getattr(importlib.import_module(module_name), name), model.get("init_args"))
    check_chat_prompts(model.get("init_args"), data.get("init_args"))
