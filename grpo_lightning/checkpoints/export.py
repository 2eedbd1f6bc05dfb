"""Export the policy of a training checkpoint as a plain Hugging Face model directory.

    grpo-lightning export --ckpt_path runs/grpo/version_0/checkpoints/last.ckpt --output_dir grpo-model
    python -m grpo_lightning.checkpoints.export ...  (the same)

The directory loads with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``
(and serves with any Hugging Face-compatible engine). The base model the run started from
(``--model.model``, recorded in the checkpoint) must be reachable: it provides the architecture
and tokenizer; the checkpoint provides the weights.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpo_lightning.runtime.checkpoint_io import load_checkpoint_file
from grpo_lightning.models.policy import load_causal_lm
from grpo_lightning.models.lora import add_adapters, merged_model, trainable_keys
from grpo_lightning.models.sources import load_tokenizer


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a Lightning checkpoint file on the CPU with ``weights_only=True``; errors name the path and the fix."""
    if os.path.isdir(path):
        raise ValueError(
            f"{str(path)!r} is a sharded FSDP checkpoint (a directory); consolidate it into one file first: "
            f"python -m lightning.fabric.utilities.consolidate_checkpoint {path}"
        )
    return load_checkpoint_file(path)  # weights_only: a crafted pickle cannot run code


def export_checkpoint(
    ckpt_path: str | os.PathLike, output_dir: str | os.PathLike, model: str | None = None, adapter: bool = False
) -> Path:
    """Write the checkpoint's policy and the run's tokenizer to ``output_dir``; returns it.

    ``model`` overrides the base model recorded in the checkpoint (when it moved). A LoRA run's
    policy is written merged (``W + (alpha / r) B A``), or with ``adapter`` as a PEFT adapter
    directory (``PeftModel.from_pretrained(base, output_dir)``).
    """
    checkpoint = read_checkpoint(ckpt_path)
    hparams = checkpoint.get("hyper_parameters") or {}
    base = model or hparams.get("model")
    if not base:
        raise ValueError(f"checkpoint {str(ckpt_path)!r} records no base model (hyper_parameters.model); pass --model.")
    prefix = "policy."
    weights = {k[len(prefix) :]: v for k, v in checkpoint.get("state_dict", {}).items() if k.startswith(prefix)}
    if not weights:
        raise ValueError(
            f"checkpoint {str(ckpt_path)!r} holds no policy weights (no 'policy.*' entries in its state_dict); "
            "was it written by a grpo-lightning run?"
        )
    policy_settings = hparams.get("policy") or {}
    dtype = policy_settings.get("dtype", "auto")
    policy = load_causal_lm(base, dtype, None)
    settings = policy_settings.get("peft_config")
    if adapter and not settings:
        raise ValueError(
            f"checkpoint {str(ckpt_path)!r} is not of a LoRA run (no policy.peft_config): export the model."
        )
    if settings:
        policy = add_adapters(policy, settings)
        unexpected = policy.load_state_dict(weights, strict=False).unexpected_keys
        missing = trainable_keys(policy, "") - set(weights)
        if unexpected or missing:
            raise ValueError(f"checkpoint {str(ckpt_path)!r}: adapters do not match policy.peft_config "
                             f"(unexpected {unexpected[:3]}, missing {sorted(missing)[:3]}).")  # fmt: skip
        policy = policy if adapter else merged_model(policy)
    else:
        policy.load_state_dict(weights, strict=True)
    tokenizer = load_tokenizer(
        policy_settings.get("tokenizer") or base
    )  # padded with EOS where it has no pad, as the run
    output = Path(output_dir)
    policy.save_pretrained(output)
    tokenizer.save_pretrained(output)
    return output


def main(argv: Sequence[str] | None = None, prog: str = "python -m grpo_lightning.checkpoints.export") -> None:
    """A user's error (a missing, damaged or unsafe checkpoint, a wrong option) is one ``error:`` line,
    exit status 2."""
    parser = argparse.ArgumentParser(allow_abbrev=False, prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt_path", required=True, help="a .ckpt file written during training")
    parser.add_argument("--output_dir", required=True, help="directory to write the Hugging Face model to")
    parser.add_argument("--model", default=None, help="base model, when it is no longer where the run found it")
    parser.add_argument("--adapter", action="store_true", help="LoRA runs: write the PEFT adapter, not the merged model")
    args = parser.parse_args(argv)
    try:
        output = export_checkpoint(args.ckpt_path, args.output_dir, model=args.model, adapter=args.adapter)
    except (ValueError, FileNotFoundError) as error:  # ConfigError, CorruptCheckpointError, UnsafeCheckpointError
        parser.exit(2, f"{parser.prog}: error: {str(error).strip().splitlines()[0]}\n")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
