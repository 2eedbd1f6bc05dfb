"""Where the KL penalty against the reference model goes (``--model.kl.placement``): into each
token's loss, or into each completion's reward before the advantages. Both take the per-token
estimate ``kl_t`` of :func:`grpo_lightning.algorithms.functional.kl_estimate` (``log pi`` against
``log pi_ref``; k3 in the loss, k1 in the reward unless ``kl.estimator`` names another)."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from grpo_lightning.algorithms import functional as F


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


#: ``kl.placement`` -> what puts the KL there.
KL_PLACEMENTS: dict[str, Callable[..., object]] = {"loss": kl_in_loss, "reward": kl_in_reward}
