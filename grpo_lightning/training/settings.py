"""Checks of the module's settings that need more than one group, the variant or the data, before
any work is done: each error names the field and the fix.

Each option group checks its own fields (:mod:`grpo_lightning.training.options`); the engine options are
checked where they are resolved (:mod:`grpo_lightning.rollout.generation`).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from grpo_lightning.algorithms.kl import KL_PLACEMENTS
from grpo_lightning.algorithms.rollout_correction import check_old_logprobs
from grpo_lightning.data.checks import fit_prompts
from grpo_lightning.data.coverage import warn_lost_characters
from grpo_lightning.errors import ConfigError, require
from grpo_lightning.models.sources import WARM_START_PREFIX, resolve_model_source, warm_start_builder
from grpo_lightning.rewards.scoring import resolve_function
from grpo_lightning.runtime.cpu_precision import warn_emulated_bf16
from grpo_lightning.training.options import GROUPS, OptionGroup

def check_model(model: str, policy: Any) -> None:
    """Raise :class:`ConfigError` for a model (or the tokenizer of ``policy``, a group or a dict of
    its fields) that cannot load."""
    require(isinstance(model, str) and model != "", "model: give a hub id or a local directory of a causal LM.")
    check_model_path("model", model)
    tokenizer = policy.get("tokenizer") if isinstance(policy, dict) else getattr(policy, "tokenizer", None)
    if isinstance(tokenizer, str) and tokenizer != "":
        check_model_path("policy.tokenizer", tokenizer)


def check_model_path(field: str, path: str) -> None:
    """Raise :class:`ConfigError` for a checkpoint that cannot load: a local path that does not
    exist (it is never tried on the hub, where it would fail later with a less helpful error), or a
    GGUF file without the packages that read it (:func:`grpo_lightning.models.sources.resolve_model_source`).
    A built-in warm start is only checked here; loading the model trains it if it is not cached."""
    if path.startswith(WARM_START_PREFIX):
        warm_start_builder(path, field)
        return
    resolve_model_source(path, field)


#: The options a variant may declare inapplicable (``inapplicable_options``): what it must keep is
#: its own preset's value.
DECLARABLE_OPTIONS = (
    "advantage", "loss.surrogate", "loss.clip_eps_low", "loss.clip_eps_high", "loss.delta", "loss.clip_ratio_c",
    "loss.off_policy_mask_threshold", "loss.entropy_coef", "loss.top_entropy_quantile",
    "loss.mask_truncated_completions", "sampling.correction", "rewards.scale", "rewards.aggregation", "kl.unbiased",
    "environment",  # multi-turn rollouts: refused by variants that need one completion per prompt
    "optim.micro_batch_tokens",  # refused by variants whose own passes count rows
)  # fmt: skip


def check_options_apply(variant: type, inapplicable: dict[str, str], kl_placement: str,
                        values: Mapping[str, Any]) -> None:  # fmt: skip
    """Raise :class:`ConfigError` for an option set away from ``variant``'s preset on a variant whose
    equations leave no place for it (``inapplicable``: option -> reason; ``kl.unbiased`` also where
    the KL is in the reward), and for a ``kl_placement`` its loop refuses (``refused_kl_placements``).
    ``values``: dotted option -> value."""
    refused = variant.refused_kl_placements.get(kl_placement)
    if refused is not None:
        allowed = [name for name in KL_PLACEMENTS if name not in variant.refused_kl_placements]
        raise ConfigError(f"kl.placement: {variant.__name__} cannot put the KL in the {kl_placement} ({refused}); "
                          f"give --model.kl.placement {' or '.join(allowed)}, or drop it.")  # fmt: skip
    reasons = dict(inapplicable)
    for option, reason in KL_PLACEMENTS[kl_placement].inapplicable.items():  # kl.unbiased, with the KL in the reward
        reasons.setdefault(option, reason)
    for option, reason in reasons.items():
        if option in DECLARABLE_OPTIONS and values[option] != option_default(variant, option):
            raise ConfigError(
                f"{option}: does not apply to {variant.__name__} ({reason}); drop --model.{option} or pick another variant."
            )


def option_default(variant: type, option: str) -> Any:
    """The value of the dotted ``option`` (``loss.delta``, ``advantage``) in ``variant``'s preset."""
    name, _, field = option.partition(".")
    value = preset(variant, name)
    if field:
        value = value.get(field) if isinstance(value, dict) else getattr(value, field)
    return value


def resolve_rewards(
    reward_funcs: Sequence[str | Callable], reward_weights: Sequence[float] | None
) -> tuple[list[tuple[str, Callable]], torch.Tensor]:
    """``(name, function)`` of each reward function, and their weights ``[F]`` (default: all 1), as
    :func:`check_rewards` checked them."""
    functions = [resolve_function(spec, f"rewards.funcs[{i}]") for i, spec in enumerate(reward_funcs)]
    weights = [1.0] * len(functions) if reward_weights is None else [float(w) for w in reward_weights]
    return functions, torch.tensor(weights, dtype=torch.float32)


def check_rollout_size(prompts_per_step: int | None, group_size: int, minibatch_size: int | None) -> None:
    """Raise unless the minibatches tile the rollout of ``prompts_per_step x group_size`` completions."""
    if prompts_per_step is None or minibatch_size is None:
        return
    rollout_size = prompts_per_step * group_size
    require(
        rollout_size % minibatch_size == 0,
        f"minibatch_size ({minibatch_size}) must divide the rollout size data.batch_size x group_size "
        f"= {prompts_per_step} x {group_size} = {rollout_size}: change --model.optim.minibatch_size or --data.batch_size.",
    )


def check_before_loading(module: Any, stage: str) -> None:
    """What a run's settings and data say before any model is loaded (``LightningModule.setup``):
    bf16 on a CPU that emulates it, and for a fit the rollout size against ``minibatch_size``."""
    warn_emulated_bf16(module.trainer)
    if stage == "fit":
        datamodule = module.trainer.datamodule
        settings = module.settings
        check_rollout_size(getattr(datamodule, "batch_size", None), settings.group_size, settings.minibatch_size)


def check_datasets(datamodule: Any, tokenizer: PreTrainedTokenizerBase, format_prompt: Callable[[Any], str],
                   context: int | None, max_new_tokens: int, group_size: int, minibatch_size: int | None) -> None:
    """Before the first step: the rollout size against ``minibatch_size``, and every prompt of the
    train and validation splits (as ``format_prompt`` writes it) against the model's ``context``,
    as the data module's ``long_prompts`` says (:func:`grpo_lightning.data.checks.fit_prompts`; a
    data module without one: ``"error"``); a warning when prompts lose characters to the tokenizer
    (:func:`grpo_lightning.data.coverage.warn_lost_characters`)."""
    check_rollout_size(getattr(datamodule, "batch_size", None), group_size, minibatch_size)
    column = getattr(datamodule, "prompt_column", "prompt")
    handling = getattr(datamodule, "long_prompts", "error")

    def fit(dataset: Any, split: str) -> Any:
        return fit_prompts(dataset, column, tokenizer, format_prompt, context, max_new_tokens, handling, split)

    for split in ("train", "val"):
        dataset = getattr(datamodule, f"{split}_dataset", None)
        fitted = None if dataset is None else fit(dataset, split)
        if fitted is not dataset:  # truncated or skipped rows
            setattr(datamodule, f"{split}_dataset", fitted)
    extra = getattr(datamodule, "extra_val_datasets", {})
    for name, dataset in extra.items():
        extra[name] = fit(dataset, f"val_sets.{name}")
    train, batch_size = getattr(datamodule, "train_dataset", None), getattr(datamodule, "batch_size", None)
    check_same_rows_on_every_device(getattr(datamodule, "trainer", None), train, column)
    splits = {"train": train, "val": getattr(datamodule, "val_dataset", None)}
    splits.update({f"val_sets.{name}": dataset for name, dataset in extra.items()})
    warn_lost_characters(splits, column, tokenizer, format_prompt)
    require(
        train is None or batch_size is None or len(train) >= batch_size,
        f"data.batch_size={batch_size} is larger than the {len(train or ())} training prompts left after "
        f"data.long_prompts={handling!r}; lower --data.batch_size or --model.sampling.max_new_tokens.",
    )


def rows_digest(dataset: Any, column: str) -> int:
    """63 bits of a SHA-256 over the ``column`` of ``dataset``'s rows, in order."""
    digest = hashlib.sha256()
    for value in dataset[column]:
        digest.update(json.dumps(value, sort_keys=True, default=str).encode() + b"\0")
    return int.from_bytes(digest.digest()[:8], "big") >> 1


def check_same_rows_on_every_device(trainer: Any, train: Any, column: str) -> None:
    """Refuse a fit whose processes loaded other training prompts: the sampler gives each device its
    share of one order, so each would train on a share of another set (data generated per process
    from an unseeded source, or in an order that follows Python's hash seed)."""
    if trainer is None or train is None or getattr(trainer, "world_size", 1) < 2:
        return
    mine = torch.tensor([rows_digest(train, column)], dtype=torch.int64, device=trainer.strategy.root_device)
    digests = trainer.strategy.all_gather(mine).flatten().tolist()
    others = [rank for rank, digest in enumerate(digests) if digest != digests[0]]
    require(not others, f"data: the processes of this fit loaded other training prompts (rank 0's differ from rank "
                        f"{others[0] if others else 0}'s), so each device would train on a share of another set. Data "
                        "generated in each process must not depend on it: set PYTHONHASHSEED=0 in the environment of "
                        "every process (some reasoning-gym tasks follow it), or give a task that repeats itself.")  # fmt: skip


def field_names(cls: type) -> list[str]:
    """The fields of an option group, in order."""
    return [f.name for f in fields(cls)]


def preset(variant: type, name: str) -> Any:
    """The default of the constructor argument ``name`` in ``variant`` (the closest class that names
    it): a variant's preset group, or part."""
    for cls in variant.__mro__:
        init = cls.__dict__.get("__init__")
        parameter = inspect.signature(init).parameters.get(name) if init is not None else None
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            return parameter.default
    raise KeyError(name)


def resolve_groups(variant: type, values: Mapping[str, Any]) -> dict[str, OptionGroup]:
    """Each group of ``values`` (a group, a dict of some of its fields, or ``None``) made and
    checked against ``variant``'s preset; then ``sampling.correction`` against ``sampling.old_logprobs``
    (:func:`~grpo_lightning.algorithms.rollout_correction.check_old_logprobs`)."""
    groups = {name: cls.of(values[name], preset(variant, name)) for name, cls in GROUPS.items()}
    sampling = groups["sampling"]
    check_old_logprobs(sampling.rollout_correction(), sampling.old_logprobs)
    return groups
