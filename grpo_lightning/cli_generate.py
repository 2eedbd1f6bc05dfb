"""What ``grpo-lightning generate`` needs: prompts, an output, and a model, from ``--ckpt_path`` (a
fit's checkpoint names its variant and settings) or ``--model``; no data and no trainer config.

    grpo-lightning generate --ckpt_path runs/grpo/version_0/checkpoints/last.ckpt --prompts p.jsonl --output out.jsonl
"""

from __future__ import annotations

from typing import Any

from grpo_lightning.errors import ConfigError

#: Arguments that ``fit`` requires and ``generate`` does not: the checkpoint can give the model, and
#: the prompts come from ``--prompts``.
OPTIONAL_FOR_GENERATE = ("model", "data")


def make_optional(parser: Any, keys: tuple[str, ...] = OPTIONAL_FOR_GENERATE) -> None:
    """Let ``parser`` (the ``generate`` subcommand's) parse without ``keys`` (``--model``, ``--data``)."""
    for action in parser._actions:
        if action.dest in keys:
            action.required = False
    for name in ("_extra_required_keys", "required_args"):  # where jsonargparse versions keep required keys
        required = getattr(parser, name, None)
        if isinstance(required, set):
            required.difference_update(keys)


def require_model(config: Any) -> None:
    """``generate``'s configuration names a model, from ``--ckpt_path`` or ``--model``."""
    if config.get("model") is None:
        raise ConfigError(
            "generate: no model; give --ckpt_path with a checkpoint of a fit (it names the variant and its settings), "
            "or --model NAME --model.model PATH_OR_HUB_ID."
        )
