"""What a run's hooks and update loop read of its options, resolved once in the module's ``__init__``.

:class:`RunSettings` (``module.settings``, frozen) holds the parts by their registered names, where the
KL goes and its estimator, the clip bounds and the other settings of the run's surrogate, the group
and batch sizes. :class:`Coefficients` (``module.coefficients``) holds the two values a schedule may
steer during a fit, ``beta`` and ``entropy_coef``: they start at ``kl.beta`` and ``loss.entropy_coef``
(the options keep those start values) and change only through ``module.set_coefficient``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from grpo_lightning.algorithms import KL_PLACEMENTS, SURROGATES, resolve_parts, surrogate_clip
from grpo_lightning.algorithms.rollout_correction import Correction
from grpo_lightning.errors import ConfigError

#: The coefficients a schedule may steer, each with the step metric its new value is logged as.
STEERED = {"beta": "beta", "entropy_coef": "entropy/coef"}


@dataclass(frozen=True)
class RunSettings:
    """The run's resolved settings. Frozen: what needs others builds a copy (``dataclasses.replace``)."""

    advantage: str | None
    """The registered advantage estimator: ``advantage``, else the variant's ``default_advantage``."""
    aggregation: str | None
    """The registered loss aggregation: ``aggregation``, else the variant's ``default_aggregation``."""
    surrogate: str
    """The registered per-token surrogate: ``loss.surrogate``, else the variant's ``default_surrogate``."""
    surrogate_options: tuple[tuple[str, Any], ...]
    """``(name, value)`` of each keyword argument of the surrogate's function that the run gives
    (:func:`surrogate_options`); the paper's default stands for the others."""
    kl_placement: str
    """Where the KL goes: ``kl.placement``, else the variant's ``default_kl_placement``."""
    kl_estimator: str
    """``kl.estimator``, else the placement's (k3 in the loss, k1 in the reward)."""
    clip_eps_low: float | None
    """``loss.clip_eps_low``, or for ``None`` the surrogate's own (CISPO's: none)."""
    clip_eps_high: float | None
    """``loss.clip_eps_high``, or for ``None`` the surrogate's own."""
    group_size: int
    """Completions per prompt, ``G`` (``sampling.group_size``)."""
    ppo_epochs: int
    """Passes over each rollout (``optim.ppo_epochs``)."""
    minibatch_size: int | None
    """Completions per optimizer step; ``None``: the whole rollout (``optim.minibatch_size``)."""
    micro_batch_size: int | None
    """Completions per pass; ``None`` under ``optim.micro_batch_tokens`` (``optim.micro_batch_size``)."""
    rollout_correction: Correction
    """The engine's importance correction with its bounds (``sampling.correction*``)."""


def resolve_settings(variant: type, groups: Mapping[str, Any], advantage: str | None, aggregation: str | None,
                     kl_placement: str, own: Mapping[str, Any]) -> RunSettings:  # fmt: skip
    """The :class:`RunSettings` of ``variant`` with the option ``groups`` (by constructor argument),
    the ``advantage`` and ``aggregation`` given (``None``: the variant's), the resolved
    ``kl_placement`` and the variant's own constructor arguments ``own`` (:func:`own_arguments`)."""
    sampling, rewards, loss, kl, optim = (groups[name] for name in ("sampling", "rewards", "loss", "kl", "optim"))
    advantage, aggregation, surrogate = resolve_parts(variant, advantage, aggregation, rewards.scale, loss.surrogate)
    clip_eps_low, clip_eps_high = surrogate_clip(surrogate, loss)
    clip = {"clip_eps_low": clip_eps_low, "clip_eps_high": clip_eps_high}
    return RunSettings(
        advantage=advantage, aggregation=aggregation, surrogate=surrogate,
        surrogate_options=surrogate_options(surrogate, clip, loss, variant.__name__, own),
        kl_placement=kl_placement, kl_estimator=kl.estimator or KL_PLACEMENTS[kl_placement].estimator,
        clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, group_size=sampling.group_size,
        ppo_epochs=optim.ppo_epochs, minibatch_size=optim.minibatch_size, micro_batch_size=optim.micro_batch_size,
        rollout_correction=sampling.rollout_correction(),
    )  # fmt: skip


def surrogate_options(surrogate: str, clip: Mapping[str, float | None], loss: Any, variant: str,
                      own: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:  # fmt: skip
    """``(name, value)`` of each setting the function of ``surrogate`` takes, looked up in this
    order: the clip bounds as resolved for it (``clip``), the ``loss`` options, the constructor
    arguments ``variant`` declares (``own``: SAPO's ``tau_pos``). One found in none keeps the
    function's default; one without a default is a :class:`ConfigError` naming it."""
    part, loss_options = SURROGATES[surrogate], {field.name for field in dataclasses.fields(loss)}
    found = []
    for name in part.options():
        if name in clip:
            found.append((name, clip[name]))
        elif name in loss_options:
            found.append((name, getattr(loss, name)))
        elif name in own:
            found.append((name, own[name]))
        elif name in part.required():
            raise ConfigError(
                f"loss.surrogate: {surrogate} needs {name}, which is neither a loss option nor an argument of "
                f"{variant}; pick a variant that takes {name}, or another --model.loss.surrogate."
            )
    return tuple(found)


def own_arguments(variant: type, base: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor arguments that ``variant`` declares beyond those of ``base`` (SAPO's
    ``tau_pos``), with their values in ``values`` (the module's hyperparameters)."""
    taken = set(inspect.signature(base.__init__).parameters)
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    declared = {
        name
        for cls in variant.__mro__[: variant.__mro__.index(base)]
        if "__init__" in vars(cls)
        for name, parameter in inspect.signature(vars(cls)["__init__"]).parameters.items()
        if parameter.kind in kinds and name not in taken
    }
    return {name: values[name] for name in sorted(declared) if name in values}


@dataclass(frozen=True)
class Coefficients:
    """The loss's coefficients in use now (``module.coefficients``); a schedule changes one only
    through ``module.set_coefficient``, which logs the new value (:data:`STEERED`)."""

    beta: float
    """The KL term's; it starts at ``kl.beta``."""
    entropy_coef: float
    """The entropy bonus's; it starts at ``loss.entropy_coef``."""

    def with_value(self, name: str, value: float) -> Coefficients:
        """A copy with ``name`` (one of :data:`STEERED`) set to ``value``."""
        if name not in STEERED:
            raise ValueError(f"set_coefficient: {name!r} is not a coefficient a schedule steers; give one of "
                             f"{', '.join(STEERED)}.")  # fmt: skip
        return dataclasses.replace(self, **{name: float(value)})
