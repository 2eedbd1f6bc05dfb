"""RLOO: Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
Learning from Human Feedback in LLMs", section 3.

Each completion is one action; its baseline is the mean reward of the other ``k - 1`` samples of
the same prompt (eq. 7)::

    A_i = r_i - 1/(k-1) sum_{j != i} r_j
    J   = 1/k sum_i A_i log pi(y_i | x)

The KL penalty is part of the reward, as in RLHF: ``r_i <- r_i - beta * sum_t (log pi - log pi_ref)``
(``kl_in_reward``; set it false to use a KL term in the loss instead). With one optimizer step per
rollout the clipped ratio is 1 and the update is exactly REINFORCE with the leave-one-out baseline.
"""

from __future__ import annotations

from torch import Tensor

from grpo_lightning import functional as F
from grpo_lightning.module import GroupPolicyOptimization
from grpo_lightning.rollout import Rollout
from grpo_lightning.settings import check_options_apply


class RLOO(GroupPolicyOptimization):
    """Leave-one-out baseline; the loss sums over each completion's tokens."""

    inapplicable_options = {"scale_rewards": "its leave-one-out advantage is divided by no std"}

    def __init__(self, model: str, *, beta: float = 0.05, kl_in_reward: bool = True, **kwargs) -> None:
        super().__init__(model, beta=beta, **kwargs)
        self.kl_in_loss = not kl_in_reward
        check_options_apply(type(self), self.inapplicable_options, self.kl_in_loss, self.hparams)

    def advantages(self, rewards: Tensor) -> Tensor:
        """``r_i - mean_{j != i} r_j``."""
        return F.leave_one_out_advantages(rewards)

    def shape_rewards(self, rewards: Tensor, rollout: Rollout) -> Tensor:
        """``r - beta * sum_t k1`` when the KL is in the reward."""
        if self.kl_in_loss or rollout.ref_logp is None:
            return rewards
        kl = F.masked_sum(F.kl_k1(rollout.old_logp, rollout.ref_logp), rollout.completion_mask, dim=-1)
        self.step_metrics.update("kl_penalty", (self.beta * kl).mean())
        return rewards - self.beta * kl

    def aggregate(self, loss: Tensor, mask: Tensor, *, num_sequences: int | None = None, num_tokens=None) -> Tensor:
        """``1/k sum_i sum_t loss_it`` (the completion's log-prob is the sum of its tokens')."""
        return F.sequence_mean_token_sum(loss, mask, num_sequences=num_sequences)
