"""Arms that differ in their clipping, in cells where no clip bound can act: a warning before any cell runs.

Every clip setting (the surrogate, ``loss.clip_eps_low`` / ``clip_eps_high``, ``delta``,
``clip_ratio_c``, ``off_policy_mask_threshold``) acts on the ratio ``pi / pi_old``, and every shipped
surrogate is the plain policy gradient where that ratio is 1. It is exactly 1 at every update where a
rollout makes one optimizer step (``ppo_epochs x minibatches``, split as the update loop splits it:
:func:`~grpo_lightning.training.update.minibatches_per_epoch`; DAPO's dynamic sampling still trains
on one batch) and the old log-probs are the current ones (``sampling.old_logprobs: recompute``;
stale rollouts then change the rollout correction's weights, not this ratio). Arms that differ only
in their clipping then train identically (CISPO and DPPO). The sweep says so and runs: the arms'
other settings may be what it compares.
"""

from __future__ import annotations

import importlib
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from grpo_lightning.ablation.labels import lookup
from grpo_lightning.ablation.spec import Cell

logger = logging.getLogger(__name__)

#: The loss options that bound or mask by the ratio, besides the surrogate itself.
CLIP_OPTIONS = ("clip_eps_low", "clip_eps_high", "delta", "clip_ratio_c", "off_policy_mask_threshold")


def setting(resolved: Any, key: str, default: Any = None) -> Any:
    """The resolved value of ``key`` (``model.optim.ppo_epochs``), ``default`` where it has none."""
    found, value = lookup(resolved, key)
    return value if found else default


def steps_per_rollout(resolved: Any) -> int | None:
    """Optimizer steps each rollout makes, as the update loop counts them; ``None`` where the
    rollout's prompts (``data.batch_size``) are unknown and a ``minibatch_size`` splits it."""
    from grpo_lightning.training.update import minibatches_per_epoch  # imported by the parse this reads

    prompts, minibatch_size = setting(resolved, "data.batch_size"), setting(resolved, "model.optim.minibatch_size")
    epochs = setting(resolved, "model.optim.ppo_epochs", 1)
    if minibatch_size is None:
        return epochs
    if not isinstance(prompts, int):
        return None
    return epochs * minibatches_per_epoch(prompts, setting(resolved, "model.sampling.group_size"), minibatch_size)


def ratio_stays_one(resolved: Any) -> bool:
    """Whether the importance ratio is 1 at every update of the cell: one optimizer step per
    rollout, with the old log-probs recomputed (then they equal the current ones)."""
    recomputed = setting(resolved, "model.sampling.old_logprobs", "recompute") == "recompute"
    return recomputed and steps_per_rollout(resolved) == 1


def clip_settings(resolved: Any) -> tuple[tuple[str, Any], ...]:
    """``(name, value)`` of the cell's surrogate and its clip options, a bound left ``None`` given as
    the surrogate's own (:func:`~grpo_lightning.algorithms.surrogate_clip`)."""
    from grpo_lightning.algorithms import SURROGATES, surrogate_clip
    from grpo_lightning.errors import ConfigError

    loss = SimpleNamespace(**{name: None for name in ("surrogate", *CLIP_OPTIONS)})
    loss.__dict__.update(setting(resolved, "model.loss", {}) or {})
    surrogate = loss.surrogate or getattr(_variant_class(resolved), "default_surrogate", None)
    try:
        surrogate = SURROGATES.resolve(surrogate)
        loss.clip_eps_low, loss.clip_eps_high = surrogate_clip(surrogate, loss)
    except (ConfigError, KeyError):  # not one the fit knows: it will say so itself
        pass
    return (("surrogate", surrogate), *((name, getattr(loss, name)) for name in CLIP_OPTIONS))


def _variant_class(resolved: Any) -> Any:
    module, _, name = str(setting(resolved, "model.class_path", "")).rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def arms_apart(settings: Mapping[str, Any]) -> list[str]:
    """The arms whose settings differ from those most arms share; every arm when no settings are
    shared by more arms than any other; none when all are alike."""
    counts = Counter(settings.values()).most_common()
    if len(counts) < 2:
        return []
    shared = counts[0][0] if counts[0][1] > counts[1][1] else None
    return [arm for arm, value in settings.items() if value != shared]


def one_step_description(resolved: Any) -> str:
    """What makes one optimizer step per rollout, e.g. ``optim.minibatch_size 256 = 32 prompts x 8
    completions, ppo_epochs 1`` (the prompts are known wherever a ``minibatch_size`` is given)."""
    prompts, group_size = setting(resolved, "data.batch_size"), setting(resolved, "model.sampling.group_size")
    minibatch_size = setting(resolved, "model.optim.minibatch_size")
    epochs = setting(resolved, "model.optim.ppo_epochs", 1)
    rollout = f"{prompts} prompts x {group_size} completions" if prompts else f"{group_size} completions a prompt"
    if minibatch_size is None:
        size = f"null (the whole rollout: {rollout})"
    else:
        size = f"{minibatch_size} {'=' if minibatch_size == prompts * group_size else '>='} {rollout}"
    return f"optim.minibatch_size {size}, ppo_epochs {epochs}"


def inert_clipping_warning(cells: Sequence[Cell], configs: Sequence[Any]) -> str | None:
    """The warning for ``cells`` with their resolved ``configs``: arms whose clip settings differ,
    where every cell's importance ratio stays 1; ``None`` where no such arms are."""
    if not cells or len(configs) != len(cells) or not all(ratio_stays_one(config) for config in configs):
        return None
    by_arm: dict[str, tuple] = {}
    for cell, config in zip(cells, configs):  # the seeds of an arm share its settings
        by_arm.setdefault(cell.arm, clip_settings(config))
    named = arms_apart(by_arm)
    if not named:
        return None
    how = "; ".join(sorted({one_step_description(config) for config in configs}))
    return (
        f"arms {', '.join(named)} differ in their clip settings, but every cell takes one optimizer step per "
        f"rollout ({how}): the importance ratio stays 1, no clip bound acts, and arms that differ only there will "
        "train identically. To compare clipping, set optim.minibatch_size below prompts x group_size (several "
        "optimizer steps per rollout) or ppo_epochs > 1."
    )


def warn_of_inert_clipping(cells: Sequence[Cell], configs: Sequence[Any]) -> None:
    """Log :func:`inert_clipping_warning` as a warning, where there is one."""
    message = inert_clipping_warning(cells, configs)
    if message is not None:
        logger.warning("%s", message)
