"""A user's own parts, in a module of the user's: the package's decorators register them when it is
imported, as an option's import path imports it (``--model.advantage tests.conformance.user_parts.group_median``).
Not a test file: the conformance suite runs on what it registers (the ``user_parts`` fixture)."""

from __future__ import annotations

from torch import Tensor

from grpo_lightning.algorithms import KLPlacement, register_advantage, register_aggregation, register_kl_placement
from grpo_lightning.algorithms.kl import kl_in_loss, kl_in_reward


@register_advantage()
def group_median(rewards: Tensor) -> Tensor:
    """``A_pi = r_pi - median_g r_p`` (the lower median of an even group). ``[P, G]`` -> ``[P, G]``."""
    return rewards - rewards.median(dim=1, keepdim=True).values


@register_aggregation("seq_mean_token_sqrt_mean")
def sqrt_length_mean(loss: Tensor, mask: Tensor, *, num_sequences=None, num_tokens=None, max_tokens: int = 1) -> Tensor:
    """``1/N sum_i |o_i|^-1/2 sum_t loss_it``: between a sequence's token mean and its token sum;
    ``N``: the minibatch's sequences."""
    count = loss.shape[0] if num_sequences is None else num_sequences
    return ((loss * mask).sum(-1) / mask.sum(-1).clamp(min=1).sqrt()).sum() / count


@register_kl_placement("half_and_half")
class HalfInRewardHalfInLoss(KLPlacement):
    """``beta / 2`` of the KL in each completion's reward, the other half in each token's loss."""

    in_reward = True

    def shape_rewards(self, rewards: Tensor, kl: Tensor, mask: Tensor, beta: float) -> tuple[Tensor, Tensor | None]:
        return kl_in_reward(rewards, kl, mask, beta / 2)

    def add_to_loss(self, loss: Tensor, kl: Tensor, beta: float) -> Tensor:
        return kl_in_loss(loss, kl, beta / 2)
