"""Where the KL penalty against the reference model goes (``--model.kl.placement``): into each
token's loss, or into each completion's reward before the advantages. Both take the per-token
estimate ``kl_t`` of :func:`grpo_lightning.algorithms.functional.kl_estimate` (``log pi`` against
``log pi_ref``; k3 in the loss, k1 in the reward unless ``kl.estimator`` names another). Each
placement is a :class:`KLPlacement` registered by name (:func:`register_kl_placement`): the training
step asks it what to do to the rewards and to the loss, never its name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from torch import Tensor

from grpo_lightning.algorithms import functional as F
from grpo_lightning.algorithms.parts import Registry


def kl_in_loss(loss: Tensor, kl: Tensor, beta: float) -> Tensor:
    """DeepSeekMath eq. 3: ``loss_t + beta * kl_t``, taken at the current policy (gradient through
    ``kl``). ``loss``, ``kl``: ``[N, T]`` -> ``[N, T]``."""
    return loss + beta * kl


def kl_in_reward(rewards: Tensor, kl: Tensor, mask: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """RLOO (Ahmadian et al. 2024, section 3) and REINFORCE++: the penalty of the whole completion
    subtracted from its reward, ``r_i - beta * sum_t kl_it`` over its ``mask`` tokens, with ``kl``
    taken at the rollout's (old) policy, so no gradient flows through it.

    ``rewards`` ``[N]``, ``kl`` and ``mask`` ``[N, T]`` -> (shaped rewards ``[N]``, penalties
    ``beta * sum_t kl_it`` ``[N]``)."""
    penalty = beta * F.masked_sum(kl, mask, dim=-1)
    return rewards - penalty, penalty



class KLPlacement:
    """Where the KL goes: what it does to each completion's reward before the advantages
    (:meth:`shape_rewards`, where ``in_reward``) and to each token's loss (:meth:`add_to_loss`).
    Neither changes anything here; a placement overrides what it does."""

    #: ``kl.estimator`` where none is given.
    estimator: ClassVar[str] = "k3"
    #: Whether :meth:`shape_rewards` takes the KL of the rollout's (old) policy: the update then
    #: computes the old log-probs before the advantages.
    in_reward: ClassVar[bool] = False
    #: Options that have no place with the KL here: ``option -> reason``.
    inapplicable: ClassVar[Mapping[str, str]] = {}

    def shape_rewards(self, rewards: Tensor, kl: Tensor, mask: Tensor, beta: float) -> tuple[Tensor, Tensor | None]:
        """``rewards`` ``[N]`` with the KL ``kl`` ``[N, T]`` of the old policy over ``mask``, and the
        penalty of each completion ``[N]`` to log (``kl_penalty``), ``None`` for none."""
        return rewards, None

    def add_to_loss(self, loss: Tensor, kl: Tensor, beta: float) -> Tensor:
        """The per-token loss ``[N, T]`` with the KL ``kl`` ``[N, T]`` of the current policy (with its gradient)."""
        return loss


def placement_part(given: Any) -> KLPlacement | None:
    """``given`` if a :class:`KLPlacement`, an instance of it if a subclass, else ``None``."""
    if isinstance(given, type) and issubclass(given, KLPlacement):
        return given()
    return given if isinstance(given, KLPlacement) else None


#: ``kl.placement`` -> the :class:`KLPlacement` it names.
KL_PLACEMENTS = Registry("kl.placement", "a KLPlacement (or a subclass of it)", placement_part)


def register_kl_placement(name: str) -> Callable[[Any], Any]:
    """Decorator: register a :class:`KLPlacement` subclass (an instance of it) or instance as
    ``--model.kl.placement NAME``."""
    return KL_PLACEMENTS.decorator(name)


@register_kl_placement("loss")
class KLInLoss(KLPlacement):
    """The KL in each token's loss (:func:`kl_in_loss`), k3 by default (DeepSeekMath)."""

    def add_to_loss(self, loss: Tensor, kl: Tensor, beta: float) -> Tensor:
        return kl_in_loss(loss, kl, beta)


@register_kl_placement("reward")
class KLInReward(KLPlacement):
    """The KL of the whole completion in its reward (:func:`kl_in_reward`), k1 by default (RLOO,
    REINFORCE++); taken at the old policy, it is no term of the loss to weigh (``kl.unbiased``)."""

    estimator = "k1"
    in_reward = True
    inapplicable = {"kl.unbiased": "its KL term is in the reward (kl.placement), not in the loss"}

    def shape_rewards(self, rewards: Tensor, kl: Tensor, mask: Tensor, beta: float) -> tuple[Tensor, Tensor | None]:
        return kl_in_reward(rewards, kl, mask, beta)
