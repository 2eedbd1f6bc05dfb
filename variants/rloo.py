"""RLOO: Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
Learning from Human Feedback in LLMs", section 3.

Each completion is one action; its baseline is the mean reward of the other ``k - 1`` samples of
the same prompt (eq. 7)::

    A_i = r_i - 1/(k-1) sum_{j != i} r_j
    J   = 1/k sum_i A_i log pi(y_i | x)

The KL penalty is part of the reward, as in RLHF: ``r_i <- r_i - beta * sum_t (log pi - log pi_ref)``
(``kl_in_reward``; set it false to use a KL term in the loss instead). That is the k1 estimate;
``kl.estimator`` k2 or k3 puts theirs in the reward instead (as verl's ``kl_penalty`` does). With one optimizer step per
rollout the clipped ratio is 1 and the update is exactly REINFORCE with the leave-one-out baseline.
"""

from __future__ import annotations

from torch import Tensor

from grpo_lightning.algorithms import functional as F
from grpo_lightning.training.module import GroupPolicyOptimization
from grpo_lightning.training.options import KLOptions
from grpo_lightning.rollout.types import Rollout


class RLOO(GroupPolicyOptimization):
    """Leave-one-out baseline; the loss sums over each completion's tokens."""

    inapplicable_options = {"rewards.scale": "its leave-one-out advantage is divided by no std"}

    def __init__(self, model: str, *, kl: KLOptions = KLOptions(beta=0.05), kl_in_reward: bool = True,
                 **kwargs) -> None:  # fmt: skip
        self.kl_in_loss = not kl_in_reward  # before the base's checks and its choice of estimator (k1 in the reward)
        super().__init__(model, kl=kl, **kwargs)

    #: ``r_i - mean_{j != i} r_j``.
    default_advantage = "leave_one_out"
    #: ``1/k sum_i sum_t loss_it`` (the completion's log-prob is the sum of its tokens').
    default_aggregation = "seq_mean_token_sum"

    def shape_rewards(self, rewards: Tensor, rollout: Rollout) -> Tensor:
        """``r - beta * sum_t kl_t`` when the KL is in the reward (``kl.estimator``, k1 by default)."""
        if self.kl_in_loss or rollout.ref_logp is None:
            return rewards
        kl = F.kl_estimate(rollout.old_logp, rollout.ref_logp, self.kl_estimator)
        kl = F.masked_sum(kl, rollout.completion_mask, dim=-1)
        self.step_metrics.update("kl_penalty", (self.beta * kl).mean())
        return rewards - self.beta * kl
