"""Choosing the registered parts by name, with errors that name the option and the choices."""

from __future__ import annotations

from collections.abc import Callable

from grpo_lightning.algorithms.advantages import ADVANTAGES
from grpo_lightning.algorithms.aggregations import AGGREGATIONS
from grpo_lightning.errors import ConfigError


def check_part(option: str, name: str | None, registry: dict[str, Callable]) -> None:
    """Raise :class:`ConfigError` unless ``name`` is ``None`` (the variant's own) or in ``registry``."""
    if name is not None and name not in registry:
        raise ConfigError(
            f"{option}: {name!r} is not one of {', '.join(registry)}; e.g. --model.{option} {next(iter(registry))}, "
            "or null for the variant's own."
        )


def resolve_parts(variant: type, advantage: str | None, aggregation: str | None, scale_rewards: str) -> tuple:
    """``(advantage, aggregation)``: the names given, or ``variant``'s ``default_advantage`` and
    ``default_aggregation`` for ``None``. ``scale_rewards`` divides ``group_std``'s advantages only."""
    check_part("advantage", advantage, ADVANTAGES)
    check_part("aggregation", aggregation, AGGREGATIONS)
    advantage = variant.default_advantage if advantage is None else advantage
    if advantage not in (None, "group_std") and scale_rewards != "group":
        raise ConfigError(
            f"scale_rewards: sets the divisor of group_std's advantages, and the advantage is {advantage}; "
            "drop --model.scale_rewards, or set --model.advantage group_std."
        )
    return advantage, variant.default_aggregation if aggregation is None else aggregation
