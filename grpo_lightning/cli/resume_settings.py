"""``fit --ckpt_path``: the model settings a resume takes from its checkpoint, and what it refuses.

Lightning's CLI loads a checkpoint's hyperparameters over the model configuration. A resumed fit
goes on with the checkpoint's optimizer state (its learning rate in the param groups), scheduler
and loops, so a model setting given on the command line or in a ``--config`` that differs from the
checkpoint's cannot be applied exactly, and replacing it silently trains something else than asked.
So a fit refuses it, before any work, naming every such field and both values
(:func:`check_resume_settings`). The settings of :data:`TAKEN_FROM_COMMAND_LINE` (how to validate)
do not change what is trained: a resumed fit takes those given from the command line and configs.
So does ``model`` (the base's path) where the checkpoint records its base's fingerprint: a base moved
to another folder resumes, and its weights are checked against the fingerprint as they load.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from jsonargparse import Namespace

from grpo_lightning.errors import ConfigError
from grpo_lightning.models.fingerprint import CHECKPOINT_KEY
from grpo_lightning.runtime.checkpoint_io import load_checkpoint_file

#: Model settings that a resumed fit takes from the command line and the configs over the checkpoint's
#: (as ``validate``, ``test`` and ``generate`` do): how to evaluate, not what is trained.
TAKEN_FROM_COMMAND_LINE = ("evaluation",)
#: The base model's path: taken where the checkpoint records the base's fingerprint (then checked as it loads).
BASE_PATH_KEY = "init_args.model"

#: LoRA's settings: each field given compared with the checkpoint's, or peft's default (:func:`_lora_fields`).
PEFT_KEY = "init_args.policy.peft_config"

_ABSENT = object()
_UNKNOWN = object()


def _lora_fields(key: str, given: Any, saved: Any) -> tuple[Any, Any]:
    """``(given, saved)`` of the ``peft_config`` fields at ``key`` (the whole config, or one field): each
    field given beside the checkpoint's value, or peft's default where the checkpoint records none."""
    if given in (_ABSENT, _UNKNOWN, None) or saved in (_ABSENT, _UNKNOWN, None) or not isinstance(saved, Mapping):
        return given, saved
    from grpo_lightning.models.lora import default_lora_value, plain_value

    field = key[len(PEFT_KEY) :].lstrip(".").removeprefix("init_args").lstrip(".")
    if field == "class_path":  # LoRA's, the only one taken (models.lora)
        return _UNKNOWN, _UNKNOWN
    given = given.as_dict() if hasattr(given, "as_dict") else given
    if not field:  # the whole config: its fields (of ``init_args`` where it names its class)
        fields = dict(given.get("init_args") or {}) if isinstance(given, Mapping) and "class_path" in given else given
    else:
        fields = {field: given}
    if not isinstance(fields, Mapping):
        return given, saved
    fields = {name: plain_value(value) for name, value in fields.items()}
    return fields, {name: saved.get(name, default_lora_value(name)) for name in fields}


def given_model_keys(parser, raw_args: Sequence[str], subcommand: str | None) -> list[str] | None:
    """The model settings given on the command line or in a ``--config`` file of ``raw_args``, as
    dotted keys of the model's config (``init_args.optim.learning_rate``, ``class_path``): what
    the parser reads without its defaults. ``None`` when that parse fails (the check is then skipped)."""
    try:
        given = parser.parse_args(list(raw_args), defaults=False)
    except (Exception, SystemExit):  # the arguments parsed once already: nothing of the user's to report
        return None
    section = given.get(subcommand) if subcommand else given  # no subcommand: a CLI made with run=False
    model = section.get("model") if hasattr(section, "get") else None
    if model is None:
        return []
    if not hasattr(model, "items"):  # a plain value (a class path string)
        return ["class_path"]
    return [key for key, _ in model.items()]


def _value(config, key: str) -> Any:
    """The value at dotted ``key``: ``_ABSENT`` where the config has none (a group that is ``None``),
    ``_UNKNOWN`` where a plain dict (a checkpoint's, e.g. ``policy.peft_config``, which holds the
    fields set and no ``class_path``) does not record it."""
    current = config
    for part in key.split("."):
        if isinstance(current, Namespace):
            if part not in current:
                return _ABSENT
            current = current[part]
        elif isinstance(current, Mapping):
            if part in current:
                current = current[part]
            elif part != "init_args":  # a class_path/init_args value of the configs, a plain dict in the checkpoint
                return _UNKNOWN
        else:
            return _ABSENT
    return current


def _same(given: Any, saved: Any) -> bool:
    if given == saved:
        return True
    if isinstance(given, str) and isinstance(saved, str) and os.path.exists(given) and os.path.exists(saved):
        return os.path.realpath(given) == os.path.realpath(saved)  # a base model's path, written another way
    return False


def _field(key: str) -> str:
    """``init_args.optim.learning_rate`` -> ``model.optim.learning_rate``; ``class_path`` -> ``model``."""
    if key == "class_path":
        return "model"
    return "model." + key.removeprefix("init_args.").removeprefix("dict_kwargs.").replace(".init_args.", ".")


def _where(key: str, raw_args: Sequence[str]) -> str:
    """``on the command line`` when an option of ``raw_args`` names the field or a group above it, else ``in the configs``."""
    parts = _field(key).split(".")
    names = {".".join(parts[:n]) for n in range(min(2, len(parts)), len(parts) + 1)}  # --model alone: the class
    for arg in raw_args:
        option = arg[2:].split("=", 1)[0].replace(".init_args.", ".").replace(".dict_kwargs.", ".")
        if arg.startswith("--") and option in names:
            return "on the command line"
    return "in the configs"


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "(not set)"
    if hasattr(value, "as_dict"):
        value = value.as_dict()
    return repr(value) if isinstance(value, str) else str(value)


def check_resume_settings(before, after, keys: Sequence[str] | None, raw_args: Sequence[str], ckpt_path: str) -> None:
    """Compare the model config ``before`` the checkpoint's hyperparameters were loaded with the
    one ``after``, at the ``keys`` the user gave: a :class:`ConfigError` naming each that differs
    (outside :data:`TAKEN_FROM_COMMAND_LINE`, which are put back into ``after`` and printed)."""
    if not keys:
        return
    refused, taken = [], []
    for key in keys:
        given, saved = _value(before, key), _value(after, key)
        if key.startswith(PEFT_KEY):  # the checkpoint records the LoRA fields set away from peft's defaults
            given, saved = _lora_fields(key, given, _value(after, PEFT_KEY))
        if given is _UNKNOWN or saved is _UNKNOWN or _same(given, saved):
            continue
        group = key.removeprefix("init_args.").split(".", 1)[0]
        takes = key.startswith("init_args.") and group in TAKEN_FROM_COMMAND_LINE
        takes = takes or (key == BASE_PATH_KEY and records_base_fingerprint(ckpt_path))
        (taken if takes else refused).append((key, given, saved))
    if refused:
        differences = "; ".join(
            f"{_field(key)}: {_shown(given)} {_where(key, raw_args)}, {_shown(saved)} in the checkpoint"
            for key, given, saved in refused
        )  # fmt: skip
        raise ConfigError(
            f"--ckpt_path {ckpt_path}: a resumed fit continues with the checkpoint's settings, and these differ: "
            f"{differences}. Drop {'this option' if len(refused) == 1 else 'these options'} to resume as saved, "
            "or start a new fit (no --ckpt_path) with them, from the exported weights "
            "(grpo-lightning export --ckpt_path CKPT --output_dir DIR, then --model.model DIR) or from the base model."
        )
    for key, given, saved in taken:
        after[key] = given
        checked = "; its weights are checked against the checkpoint's base as they load" if key == BASE_PATH_KEY else ""
        print(f"--ckpt_path: {_field(key)} {_shown(given)} {_where(key, raw_args)} (the checkpoint's: {_shown(saved)}{checked})",
              file=sys.stderr, flush=True)  # fmt: skip


def records_base_fingerprint(ckpt_path: str) -> bool:
    """Whether the checkpoint at ``ckpt_path`` records its base model's fingerprint (those written
    before it did not: their base can only be named by the path they recorded)."""
    try:
        return load_checkpoint_file(ckpt_path, mmap=True).get(CHECKPOINT_KEY) is not None
    except Exception:  # an unreadable file: Lightning's load names it next
        return False
