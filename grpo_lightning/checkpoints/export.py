"""Export the policy of a training checkpoint as a plain Hugging Face model directory.

    grpo-lightning export --ckpt_path runs/grpo/version_0/checkpoints/last.ckpt --output_dir grpo-model
    python -m grpo_lightning.checkpoints.export ...  (the same)

The directory loads with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``
(and serves with any Hugging Face-compatible engine). The base model the run started from
(``--model.model``, recorded in the checkpoint) must be reachable: it provides the architecture
and tokenizer; the checkpoint provides the weights. A base that holds other weights than the run's
(its fingerprint, :mod:`grpo_lightning.models.fingerprint`) is refused: a LoRA run's adapters would
be merged into another model.

The directory serves as the run trained: its ``generation_config.eos_token_id`` is the ids the run's
completions ended at (the tokenizer's EOS and the base model's end of turn; a multi-turn run's turns,
the EOS alone), and a run that sent prompts as plain text (``policy.use_chat_template: false``)
exports its tokenizer without a chat template, so a serving stack does not wrap prompts in a format
the model never saw (``--keep_chat_template`` keeps it: prompts given as chat messages went through
the template whatever ``use_chat_template`` said, and the checkpoint does not record which the data held).
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from transformers import GenerationConfig

from grpo_lightning.runtime.checkpoint_io import load_checkpoint_file
from grpo_lightning.models.policy import load_causal_lm
from grpo_lightning.models.fingerprint import CHECKPOINT_KEY, check_same_base, weights_fingerprint
from grpo_lightning.models.lora import add_adapters, load_trained_weights, merged_model
from grpo_lightning.models.sources import load_tokenizer
from grpo_lightning.rollout.generation import save_policy
from grpo_lightning.rollout.types import as_ids, end_token_ids


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a Lightning checkpoint file on the CPU with ``weights_only=True``; errors name the path and the fix."""
    if os.path.isdir(path):
        raise ValueError(
            f"{str(path)!r} is a sharded FSDP checkpoint (a directory); consolidate it into one file first: "
            f"python -m lightning.fabric.utilities.consolidate_checkpoint {path}"
        )
    return load_checkpoint_file(path)  # weights_only: a crafted pickle cannot run code


def export_checkpoint(
    ckpt_path: str | os.PathLike, output_dir: str | os.PathLike, model: str | None = None, adapter: bool = False,
    keep_chat_template: bool = False,
) -> Path:
    """Write the checkpoint's policy and the run's tokenizer to ``output_dir``; returns it.

    ``model`` overrides the base model recorded in the checkpoint (when it moved). A LoRA run's
    policy is written merged (``W + (alpha / r) B A``), or with ``adapter`` as a PEFT adapter
    directory (``PeftModel.from_pretrained(base, output_dir)``). The generation config and the
    tokenizer's chat template are those the run used (:func:`as_trained`; ``keep_chat_template``:
    the tokenizer's template even where the run sent plain-text prompts without it).
    """
    return _export(ckpt_path, output_dir, model, adapter, keep_chat_template)[0]


def _export(
    ckpt_path: str | os.PathLike, output_dir: str | os.PathLike, model: str | None, adapter: bool,
    keep_chat_template: bool = False,
) -> tuple[Path, list[str]]:
    """:func:`export_checkpoint`, and what it wrote that the run's settings decided (lines for ``main``)."""
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
    check_same_base(checkpoint.get(CHECKPOINT_KEY), weights_fingerprint(policy), base, f"checkpoint {str(ckpt_path)!r}",
                    "Pass --model with the weights the run started from (a hub model: the revision it had then).")  # fmt: skip
    settings = policy_settings.get("peft_config")
    if adapter and not settings:
        raise ValueError(
            f"checkpoint {str(ckpt_path)!r} is not of a LoRA run (no policy.peft_config): export the model."
        )
    if settings:
        policy = add_adapters(policy, settings)
        missing, unexpected = load_trained_weights(policy, weights)
        if unexpected or missing:
            raise ValueError(f"checkpoint {str(ckpt_path)!r}: adapters do not match policy.peft_config "
                             f"(unexpected {unexpected[:3]}, missing {missing[:3]}).")  # fmt: skip
        policy = policy if adapter else merged_model(policy)
    else:
        policy.load_state_dict(weights, strict=True)
    tokenizer = load_tokenizer(
        policy_settings.get("tokenizer") or base
    )  # padded with EOS where it has no pad, as the run
    notes = as_trained(policy, tokenizer, hparams, keep_chat_template)
    output = Path(output_dir)
    policy.save_pretrained(output)
    tokenizer.save_pretrained(output)
    return output, notes


def run_end_ids(tokenizer, policy, hparams: dict[str, Any]) -> list[int]:
    """The ids the run's completions ended at: the tokenizer's EOS and the base model's
    ``generation_config.eos_token_id`` (:func:`~grpo_lightning.rollout.types.end_token_ids`, as
    ``configure_model`` sets them); a multi-turn run's (``environment``) turns end at the EOS alone."""
    if hparams.get("environment"):
        return as_ids(tokenizer.eos_token_id)
    return list(end_token_ids(tokenizer, policy))


def as_trained(policy, tokenizer, hparams: dict[str, Any], keep_chat_template: bool = False) -> list[str]:
    """Set what a serving stack reads to what the run did: ``generation_config.eos_token_id`` to
    :func:`run_end_ids`, and no chat template where prompts were sent as plain text
    (``policy.use_chat_template: false``). Returns a line for each."""
    notes = []
    config = getattr(policy, "generation_config", None)
    ids = run_end_ids(tokenizer, policy, hparams)
    if config is not None and ids:
        config.eos_token_id = ids[0] if len(ids) == 1 else ids
        names = ", ".join(f"{tokenizer.convert_ids_to_tokens(i)!r} ({i})" for i in ids)
        notes.append(f"generation_config.eos_token_id: {names}, where the run's completions ended")
    if not (hparams.get("policy") or {}).get("use_chat_template", True) and tokenizer.chat_template:
        if keep_chat_template:
            notes.append("tokenizer: with its chat template (--keep_chat_template), which the run's plain-text "
                         "prompts did not go through (policy.use_chat_template false)")  # fmt: skip
        else:
            tokenizer.chat_template = None
            notes.append("tokenizer: without its chat template, as the run sent plain-text prompts "
                         "(policy.use_chat_template false): send prompts as plain text too; --keep_chat_template "
                         "keeps it (for prompts given as chat messages, which went through it)")  # fmt: skip
    return notes


def save_as_trained(policy, tokenizer, directory: str | os.PathLike, hparams: dict[str, Any], write: bool = True) -> None:
    """Write ``policy`` and ``tokenizer`` as a plain Hugging Face directory (where ``write``; a sharded
    policy is gathered first, so under FSDP every process must call it), as the run trained them, as an
    export is: ``generation_config.eos_token_id`` holds the ids its completions ended at, and a run of
    plain-text prompts leaves the chat template out (:func:`write_as_trained`)."""
    save_policy(policy, tokenizer, str(directory), write=write)
    if write:
        write_as_trained(directory, tokenizer, hparams)


def write_as_trained(directory: str | os.PathLike, tokenizer, hparams: dict[str, Any]) -> list[str]:
    """Set the Hugging Face directory a fitted module wrote (its ``save_pretrained``) to what the run did,
    as an export is (:func:`as_trained`): its generation config is read, set and written back, and a
    copy of ``tokenizer`` (the run's, left as it is) is written over the one saved, with the saved
    chat template's files removed where the copy has none."""
    directory = Path(directory)
    config = GenerationConfig.from_pretrained(directory) if (directory / "generation_config.json").is_file() else None
    tokenizer = copy.deepcopy(tokenizer)
    notes = as_trained(SimpleNamespace(generation_config=config), tokenizer, hparams)
    if config is not None:
        config.save_pretrained(directory)
    if not tokenizer.chat_template:
        for stale in ("chat_template.jinja", "chat_template.json"):
            (directory / stale).unlink(missing_ok=True)
        shutil.rmtree(directory / "additional_chat_templates", ignore_errors=True)
    tokenizer.save_pretrained(directory)
    return notes


def main(argv: Sequence[str] | None = None, prog: str = "python -m grpo_lightning.checkpoints.export") -> None:
    """A user's error (a missing, damaged or unsafe checkpoint, a wrong option) is one ``error:`` line,
    exit status 2."""
    parser = argparse.ArgumentParser(allow_abbrev=False, prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt_path", required=True, help="a .ckpt file written during training")
    parser.add_argument("--output_dir", required=True, help="directory to write the Hugging Face model to")
    parser.add_argument("--model", default=None, help="base model, when it is no longer where the run found it")
    parser.add_argument("--adapter", action="store_true", help="LoRA runs: write the PEFT adapter, not the merged model")
    parser.add_argument("--keep_chat_template", action="store_true",
                        help="runs with policy.use_chat_template false: keep the tokenizer's chat template (dropped by "
                             "default, as the run's plain-text prompts never went through it)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        output, notes = _export(args.ckpt_path, args.output_dir, args.model, args.adapter, args.keep_chat_template)
    except (ValueError, FileNotFoundError) as error:  # ConfigError, CorruptCheckpointError, UnsafeCheckpointError
        parser.exit(2, f"{parser.prog}: error: {str(error).strip().splitlines()[0]}\n")
    for note in notes:
        print(note)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
