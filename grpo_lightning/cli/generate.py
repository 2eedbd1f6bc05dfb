"""What ``grpo-lightning generate`` needs: prompts, an output, and a model, from ``--ckpt_path`` (a
fit's checkpoint names its variant and settings) or ``--model``; no data and no trainer config.

    grpo-lightning generate --ckpt_path runs/grpo/version_0/checkpoints/last.ckpt --prompts p.jsonl --output out.jsonl
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from grpo_lightning.runtime.checkpoint_io import load_checkpoint_file
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


GENERATE_HELP = (
    "Write completions for a prompt file (JSONL with a 'prompt' column) to a JSONL file, sampled as in "
    "validation (model.evaluation.temperature, model.evaluation.max_new_tokens), from --ckpt_path or the start model."
)


def read_prompts(path: str) -> list[dict]:
    """Rows of a JSONL prompt file; each must have a ``prompt``."""
    if not Path(path).is_file():
        raise ConfigError(f"prompts: no such file {path!r} (looked in {os.getcwd()}); give a JSONL file with a 'prompt' column.")
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ConfigError(f"prompts: line {number} of {path!r} is not JSON ({error.msg}); give one object a line.")
            if not isinstance(row, dict) or "prompt" not in row:
                raise ConfigError(f"prompts: line {number} of {path!r} has no 'prompt'; give {{\"prompt\": ...}} a line.")
            rows.append(row)
    if not rows:
        raise ConfigError(f"prompts: {path!r} has no rows; add {{\"prompt\": ...}} lines.")
    return rows


def load_trained_policy(module, ckpt_path: str) -> None:
    """The checkpoint's policy weights into ``module``'s policy, as ``validate`` and ``export`` take them:
    refused where the base that ``model`` names holds other weights than the run trained from (a LoRA
    checkpoint keeps its adapters only, reloading that base) or a trained weight is missing."""
    from grpo_lightning.models.fingerprint import CHECKPOINT_KEY, check_same_base
    from grpo_lightning.models.lora import load_trained_weights

    checkpoint = load_checkpoint_file(ckpt_path)  # weights_only: a crafted pickle cannot run code
    check_same_base(checkpoint.get(CHECKPOINT_KEY), getattr(module.policy, "base_fingerprint", None), module.model_name,
                    f"checkpoint {str(ckpt_path)!r}", "Put the weights the run started from back at that path (a hub "
                    "model: the revision it had then), or pass --model.model with them.")  # fmt: skip
    prefix = "policy."
    weights = {k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    missing, unexpected = load_trained_weights(module.policy, weights)
    if missing or unexpected:
        raise ConfigError(f"ckpt_path: {str(ckpt_path)!r} does not hold this policy's trained weights (missing "
                          f"{missing[:3]}, unexpected {unexpected[:3]}); give the checkpoint of a run of this model "
                          "and its peft_config.")  # fmt: skip


def generate_completions(module, prompts: str, output: str, ckpt_path: str | None = None, batch_size: int = 32,
                         device=None) -> int:  # fmt: skip
    """Sample one completion per prompt of the JSONL file ``prompts`` with the module's validation
    sampling and write ``{"prompt", "completion", ...the row's other columns}`` lines to ``output``.
    With ``ckpt_path`` the policy's weights are those of the checkpoint. Returns the row count."""
    import torch

    rows = read_prompts(prompts)
    module.configure_model()
    if ckpt_path:
        load_trained_policy(module, ckpt_path)
    if device is not None:
        module.to(device)
    module.eval()
    Path(output).expanduser().parent.mkdir(parents=True, exist_ok=True)
    with open(Path(output).expanduser(), "w", encoding="utf-8") as handle, torch.no_grad():
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            batch = {key: [row.get(key) for row in chunk] for key in chunk[0]}
            batch["prompt"] = [row["prompt"] for row in chunk]
            rollout = module.generate(batch, 1, module.val_sampling)
            for row, completion in zip(chunk, rollout.completions):
                handle.write(json.dumps({**row, "completion": completion}, ensure_ascii=False) + "\n")
    return len(rows)
