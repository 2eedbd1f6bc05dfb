"""Choosing the registered parts by name, with errors that name the option and the choices."""

from __future__ import annotations

import math
from collections.abc import Callable

from grpo_lightning.algorithms.advantages import ADVANTAGES
from grpo_lightning.algorithms.aggregations import AGGREGATIONS
from grpo_lightning.algorithms.surrogates import SURROGATES
from grpo_lightning.errors import ConfigError


def check_part(option: str, name: str | None, registry: dict[str, Callable]) -> None:
    """Raise :class:`ConfigError` unless ``name`` is ``None`` (the variant's own) or in ``registry``."""
    if name is not None and name not in registry:
        raise ConfigError(
            f"{option}: {name!r} is not one of {', '.join(registry)}; e.g. --model.{option} {next(iter(registry))}, "
            "or null for the variant's own."
        )


def resolve_parts(variant: type, advantage: str | None, aggregation: str | None, scale_rewards: str,
                  surrogate: str | None = None) -> tuple:  # fmt: skip
    """``(advantage, aggregation, surrogate)``: the names given, or ``variant``'s ``default_*`` for
    ``None``. ``scale_rewards`` divides ``group_std``'s advantages only; a per-sequence surrogate
    needs one advantage per completion."""
    check_part("advantage", advantage, ADVANTAGES)
    check_part("aggregation", aggregation, AGGREGATIONS)
    check_part("surrogate", surrogate, SURROGATES)
    advantage = variant.default_advantage if advantage is None else advantage
    if advantage not in (None, "group_std") and scale_rewards != "group":
        raise ConfigError(
            f"scale_rewards: sets the divisor of group_std's advantages, and the advantage is {advantage}; "
            "drop --model.scale_rewards, or set --model.advantage group_std."
        )
    surrogate = variant.default_surrogate if surrogate is None else surrogate
    if SURROGATES[surrogate].per_sequence and variant.token_advantages:
        per_token = ", ".join(name for name, part in SURROGATES.items() if not part.per_sequence)
        raise ConfigError(
            f"surrogate: {surrogate} needs one advantage per completion, and {variant.__name__}'s are per token; "
            f"pick one of {per_token}."
        )
    return advantage, variant.default_aggregation if aggregation is None else aggregation, surrogate


def check_loss_options(delta: float | None, clip_ratio_c: float | None, off_policy_mask_threshold: float | None,
                       entropy_coef: float) -> None:  # fmt: skip
    """Raise :class:`ConfigError` for a value of the loss options that cannot train."""
    if clip_ratio_c is not None and not (isinstance(clip_ratio_c, (int, float)) and clip_ratio_c > 1):
        raise ConfigError(f"clip_ratio_c: the dual-clip bound must be > 1 (got {clip_ratio_c}); e.g. 3.0, or null for off.")
    if clip_ratio_c is not None and delta is not None:
        raise ConfigError(
            "clip_ratio_c: bounds the same negative-advantage loss as delta (for clip_ratio_c > 1 + clip_eps_high they "
            "are equal); set one of them."
        )
    if off_policy_mask_threshold is not None and not off_policy_mask_threshold >= 0:
        raise ConfigError(
            f"off_policy_mask_threshold: must be >= 0 (got {off_policy_mask_threshold}); e.g. 0.5, or null for off."
        )
    if not (math.isfinite(entropy_coef) and entropy_coef >= 0):
        raise ConfigError(f"entropy_coef: must be a finite number >= 0 (got {entropy_coef}); e.g. 0.001, or 0 for off.")
