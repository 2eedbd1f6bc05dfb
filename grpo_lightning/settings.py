"""Checks of the module's settings, before any work is done: each error names the field and the fix.

The engine options are checked where they are resolved (:mod:`grpo_lightning.generation`).
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from grpo_lightning import functional as F
from grpo_lightning.argument_types import check_argument_types
from grpo_lightning.data.checks import fit_prompts
from grpo_lightning.data.coverage import warn_lost_characters
from grpo_lightning.errors import ConfigError
from grpo_lightning.model_sources import WARM_START_PREFIX, WARM_STARTS, resolve_model_source
from grpo_lightning.rewards import resolve_reward_function
from grpo_lightning.rollout import ROLLOUT_MODES
from grpo_lightning.rollout_correction import CORRECTIONS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def require(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(message)


def check_settings(
    *,
    model: str,
    tokenizer: str | None,
    reward_funcs: Any,
    reward_weights: Any,
    accuracy_func: Any,
    dtype: str,
    rollout_dtype: str | None,
    group_size: int,
    max_new_tokens: int,
    min_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    rollout_mode: str,
    beta: float,
    kl_estimator: str,
    clip_eps_low: float,
    clip_eps_high: float,
    delta: float | None,
    scale_rewards: str,
    reward_aggregation: str,
    top_entropy_quantile: float,
    unbiased_kl: bool,
    rollout_correction: str | None,
    rollout_correction_cap: float,
    ppo_epochs: int,
    minibatch_size: int | None,
    micro_batch_size: int,
    val_temperature: float,
    val_samples: int,
    val_max_new_tokens: int | None,
    learning_rate: float,
    weight_decay: float,
    warmup_steps: int,
    max_grad_norm: float | None,
) -> None:
    """Raise :class:`ConfigError` for the first invalid argument of ``GroupPolicyOptimization``
    (their types: :func:`check_options_apply`)."""
    require(isinstance(model, str) and model != "", "model: give a hub id or a local directory of a causal LM.")
    check_model_path("model", model)
    if tokenizer is not None:
        require(tokenizer != "", "tokenizer: give a hub id or a local directory, or null for the model's own.")
        check_model_path("tokenizer", tokenizer)
    check_rewards(reward_funcs, reward_weights)
    resolve_function(accuracy_func, "accuracy_func")
    require(dtype == "auto" or dtype in DTYPES, f"dtype: {dtype!r} is not one of 'auto', {', '.join(map(repr, DTYPES))}.")
    require(
        rollout_dtype is None or rollout_dtype in DTYPES,
        f"rollout_dtype: {rollout_dtype!r} is not one of {', '.join(map(repr, DTYPES))} or null.",
    )
    require(
        group_size >= 2,
        f"group_size: must be at least 2 (got {group_size}); group-relative advantages compare completions of one prompt.",
    )
    require(
        delta is None or delta > 1 + clip_eps_high,
        f"delta: must exceed 1 + clip_eps_high = {1 + clip_eps_high} (got {delta}); e.g. --model.delta 2.0, or null for off.",
    )
    require(scale_rewards in F.REWARD_SCALES, f"scale_rewards: {scale_rewards!r} is not one of {', '.join(F.REWARD_SCALES)}.")
    require(
        reward_aggregation in REWARD_AGGREGATIONS,
        f"reward_aggregation: {reward_aggregation!r} is not one of {', '.join(REWARD_AGGREGATIONS)}.",
    )
    require(
        0 < top_entropy_quantile <= 1,
        f"top_entropy_quantile: must be in (0, 1] (got {top_entropy_quantile}); 0.2 trains on the 20% highest-entropy tokens.",
    )
    require(not unbiased_kl or beta > 0, "unbiased_kl: weights the KL term, which beta = 0 turns off; set --model.beta > 0.")
    require(
        rollout_correction in (None, *CORRECTIONS),
        f"rollout_correction: {rollout_correction!r} is not one of {', '.join(CORRECTIONS)} or null (off).",
    )
    require(rollout_correction_cap >= 1, f"rollout_correction_cap: must be >= 1 (got {rollout_correction_cap}); e.g. 2.0.")
    require(max_new_tokens >= 1, f"max_new_tokens: must be at least 1 (got {max_new_tokens}).")
    require(
        0 <= min_new_tokens <= max_new_tokens,
        f"min_new_tokens: must be between 0 and max_new_tokens ({max_new_tokens}), got {min_new_tokens}.",
    )
    require(temperature > 0, f"temperature: rollouts must be sampled, so it must be > 0 (got {temperature}).")
    require(0 < top_p <= 1, f"top_p: must be in (0, 1] (got {top_p}).")
    require(top_k >= 0, f"top_k: must be >= 0, 0 disables it (got {top_k}).")
    modes = ", ".join(map(repr, ROLLOUT_MODES))
    require(rollout_mode in ROLLOUT_MODES, f"rollout_mode: {rollout_mode!r} is not one of {modes}.")
    require(
        rollout_correction is None or rollout_mode == "sample",
        "rollout_correction: weighs tokens by the sampling engine's probabilities, and beam search samples nothing; "
        "set rollout_correction to null or rollout_mode to 'sample'.",
    )
    require(beta >= 0, f"beta: the KL coefficient must be >= 0 (got {beta}).")
    require(kl_estimator in F.KL_ESTIMATORS, f"kl_estimator: {kl_estimator!r} is not one of {F.KL_ESTIMATORS}.")
    require(0 <= clip_eps_low < 1, f"clip_eps_low: must be in [0, 1) (got {clip_eps_low}).")
    require(clip_eps_high >= 0, f"clip_eps_high: must be >= 0 (got {clip_eps_high}).")
    require(ppo_epochs >= 1, f"ppo_epochs: must be at least 1 (got {ppo_epochs}).")
    require(micro_batch_size >= 1, f"micro_batch_size: must be at least 1 (got {micro_batch_size}).")
    if minibatch_size is not None:
        require(minibatch_size >= 1, f"minibatch_size: must be at least 1 or null (got {minibatch_size}).")
        require(
            micro_batch_size <= minibatch_size,
            f"micro_batch_size ({micro_batch_size}) is larger than minibatch_size ({minibatch_size}), the completions "
            f"of one optimizer step; set --model.micro_batch_size to at most {minibatch_size}.",
        )
        require(
            minibatch_size % micro_batch_size == 0,
            f"minibatch_size ({minibatch_size}) must be a multiple of micro_batch_size ({micro_batch_size}): "
            "change one of them so micro-batches tile each minibatch.",
        )
    require(val_temperature >= 0, f"val_temperature: must be >= 0, 0 is greedy (got {val_temperature}).")
    require(
        val_max_new_tokens is None or val_max_new_tokens >= 1,
        f"val_max_new_tokens: must be at least 1, or null for max_new_tokens (got {val_max_new_tokens}).",
    )
    require(val_samples >= 1, f"val_samples: must be at least 1 (got {val_samples}).")
    require(
        val_samples == 1 or val_temperature > 0,
        f"val_samples: {val_samples} completions per prompt are all the same under greedy decoding; "
        "set --model.val_temperature 1.0 (pass@k is defined for sampled completions) or --model.val_samples 1.",
    )
    check_optimizer(learning_rate, weight_decay, warmup_steps, max_grad_norm)


def check_optimizer(learning_rate: float, weight_decay: float, warmup_steps: int, max_grad_norm: float | None) -> None:
    """Raise :class:`ConfigError` for an AdamW setting that cannot train."""
    require(
        learning_rate > 0,
        f"learning_rate: must be > 0 (got {learning_rate}); give e.g. --model.learning_rate 1e-6 "
        "(1e-3 for the tiny quickstart model).",
    )
    require(
        weight_decay >= 0,
        f"weight_decay: must be >= 0 (got {weight_decay}); give 0 for none, e.g. --model.weight_decay 0.0.",
    )
    require(
        warmup_steps >= 0,
        f"warmup_steps: must be >= 0 (got {warmup_steps}); give 0 for no warm-up, e.g. --model.warmup_steps 0.",
    )
    require(
        max_grad_norm is None or max_grad_norm > 0,
        f"max_grad_norm: must be > 0 or null (got {max_grad_norm}); give e.g. --model.max_grad_norm 1.0, "
        "or null to turn clipping off.",
    )


def check_model_path(field: str, path: str) -> None:
    """Raise :class:`ConfigError` for a checkpoint that cannot load: a local path that does not
    exist (it is never tried on the hub, where it would fail later with a less helpful error), or a
    GGUF file without the packages that read it (:func:`grpo_lightning.model_sources.resolve_model_source`).
    A built-in warm start is only named here; loading the model trains it if it is not cached."""
    if path.startswith(WARM_START_PREFIX) and path[len(WARM_START_PREFIX) :] in WARM_STARTS:
        return
    resolve_model_source(path, field)


#: Values of ``reward_aggregation``: the weighted sum as it is, or of per-group normalised scores (GDPO).
REWARD_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
#: The base module's ablation options and their "off" values (what an inapplicable option must keep),
#: and the base's defaults of the options a variant may have no place for.
ABLATION_OPTION_DEFAULTS = {
    "advantage": None,
    "surrogate": None,
    "aggregation": None,
    "clip_eps_low": 0.2,
    "clip_eps_high": 0.2,
    "delta": None,
    "clip_ratio_c": None,
    "off_policy_mask_threshold": None,
    "entropy_coef": 0.0,
    "rollout_correction": None,
    "scale_rewards": "group",
    "reward_aggregation": "sum_then_normalize",
    "top_entropy_quantile": 1.0,
    "mask_truncated_completions": False,
    "unbiased_kl": False,
    "environment": None,  # multi-turn rollouts: refused by variants that need one completion per prompt
}


def check_options_apply(variant: type, inapplicable: dict[str, str], kl_in_loss: bool, values: Any) -> None:
    """Raise :class:`ConfigError` for a constructor argument of ``variant`` (or of a base) whose value
    its annotation refuses (:func:`grpo_lightning.argument_types.check_argument_types`: a string for
    an ``int``, NaN for a ``float``), then for an ablation option set away from its default on a
    variant whose equations leave no place for it (``inapplicable``: option -> reason;
    ``unbiased_kl`` also where the KL is in the reward)."""
    check_argument_types(variant, values)
    reasons = dict(inapplicable)
    if not kl_in_loss:
        reasons.setdefault("unbiased_kl", "its KL term is in the reward, not in the loss")
    for option, reason in reasons.items():
        if option in ABLATION_OPTION_DEFAULTS and values[option] != option_default(variant, option):
            raise ConfigError(
                f"{option}: does not apply to {variant.__name__} ({reason}); drop --model.{option} or pick another variant."
            )


def option_default(variant: type, option: str) -> Any:
    """The default of ``option`` in ``variant``'s constructor (the closest class that names it),
    else the base's "off" value (:data:`ABLATION_OPTION_DEFAULTS`)."""
    for cls in variant.__mro__:
        init = cls.__dict__.get("__init__")
        parameter = inspect.signature(init).parameters.get(option) if init is not None else None
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            return parameter.default
    return ABLATION_OPTION_DEFAULTS[option]


#: The arguments of ``GroupPolicyOptimization`` that :func:`check_settings` checks.
CHECKED_SETTINGS = frozenset(inspect.signature(check_settings).parameters)


def resolve_function(spec: Any, field: str) -> tuple[str, Callable]:
    """``(name, function)`` of a reward function given as a callable or an import path; a path that
    does not import, or names no function, is a :class:`ConfigError` naming ``field``."""
    try:
        return resolve_reward_function(spec, field=field)
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(str(error)) from error


def check_rewards(reward_funcs: Any, reward_weights: Any) -> None:
    """Raise :class:`ConfigError` unless ``reward_funcs`` is a non-empty list of functions (or import
    paths) and ``reward_weights`` null or one finite number per function."""
    require(
        isinstance(reward_funcs, Sequence) and not isinstance(reward_funcs, str) and len(reward_funcs) > 0,
        f"reward_funcs: give a list of at least one reward function (got {reward_funcs!r}); "
        "e.g. --model.reward_funcs '[grpo_lightning.rewards.accuracy_reward]'.",
    )
    for i, spec in enumerate(reward_funcs):
        resolve_function(spec, f"reward_funcs[{i}]")
    if reward_weights is None:
        return
    require(
        isinstance(reward_weights, Sequence) and not isinstance(reward_weights, str),
        f"reward_weights: give a list of numbers, one per reward function, or null for all 1 (got {reward_weights!r}).",
    )
    for i, weight in enumerate(reward_weights):
        real = isinstance(weight, numbers.Real) and not isinstance(weight, bool)
        require(real and math.isfinite(weight), f"reward_weights[{i}]: must be a finite number (got {weight!r}).")
    require(
        len(reward_weights) == len(reward_funcs),
        f"reward_weights: {len(reward_weights)} weights for {len(reward_funcs)} reward functions; "
        "give one per function.",
    )


def resolve_rewards(
    reward_funcs: Sequence[str | Callable], reward_weights: Sequence[float] | None
) -> tuple[list[tuple[str, Callable]], torch.Tensor]:
    """``(name, function)`` of each reward function, and their weights ``[F]`` (default: all 1), as
    :func:`check_rewards` checked them."""
    functions = [resolve_function(spec, f"reward_funcs[{i}]") for i, spec in enumerate(reward_funcs)]
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
        f"= {prompts_per_step} x {group_size} = {rollout_size}: change --model.minibatch_size or --data.batch_size.",
    )


def check_before_loading(module: Any, stage: str) -> None:
    """What a fit's settings and data say before any model is loaded (``LightningModule.setup``):
    the rollout size against ``minibatch_size``."""
    if stage == "fit":
        datamodule = module.trainer.datamodule
        check_rollout_size(getattr(datamodule, "batch_size", None), module.group_size, module.minibatch_size)


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
    splits = {"train": train, "val": getattr(datamodule, "val_dataset", None)}
    splits.update({f"val_sets.{name}": dataset for name, dataset in extra.items()})
    warn_lost_characters(splits, column, tokenizer, format_prompt)
    require(
        train is None or batch_size is None or len(train) >= batch_size,
        f"data.batch_size={batch_size} is larger than the {len(train or ())} training prompts left after "
        f"data.long_prompts={handling!r}; lower --data.batch_size or --model.max_new_tokens.",
    )
