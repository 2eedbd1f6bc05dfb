"""Choosing the registered parts by name, with errors that name the option and the choices."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpo_lightning.algorithms.advantages import ADVANTAGES, TOKEN_STATISTICS_ADVANTAGES
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
            f"rewards.scale: sets the divisor of group_std's advantages, and the advantage is {advantage}; "
            "drop --model.rewards.scale, or set --model.advantage group_std."
        )
    chosen, surrogate = surrogate, variant.default_surrogate if surrogate is None else surrogate
    if SURROGATES[surrogate].per_sequence and (variant.token_advantages or advantage in TOKEN_STATISTICS_ADVANTAGES):
        per_token = ", ".join(name for name, part in SURROGATES.items() if not part.per_sequence)
        if chosen is None:  # the variant's own surrogate against the advantage this run names
            raise ConfigError(
                f"advantage: {advantage}'s advantages are per token, and {variant.__name__}'s surrogate {surrogate} "
                f"needs one per completion; set --model.loss.surrogate to one of {per_token}, or pick another advantage."
            )
        whose = advantage if advantage in TOKEN_STATISTICS_ADVANTAGES else f"{variant.__name__}'s"
        raise ConfigError(
            f"loss.surrogate: {surrogate} needs one advantage per completion, and {whose} are per token; "
            f"pick one of {per_token}."
        )
    return advantage, variant.default_aggregation if aggregation is None else aggregation, surrogate


def surrogate_clip(surrogate: str, loss: Any) -> tuple[float | None, float | None]:
    """``(clip_eps_low, clip_eps_high)`` of the ``loss`` options for ``surrogate``: a bound given as
    ``None`` is the surrogate's own (its paper's; CISPO's lower one: none)."""
    part = SURROGATES[surrogate]
    bounds = []
    for option in ("clip_eps_low", "clip_eps_high"):
        value = getattr(loss, option)
        if value is None and option in part.options():
            value = part.default(option)
        bounds.append(value)
    return bounds[0], bounds[1]
