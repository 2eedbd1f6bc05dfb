"""RLOO: Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
Learning from Human Feedback in LLMs", section 3.

Each completion is one action; its baseline is the mean reward of the other ``k - 1`` samples of
the same prompt (eq. 7)::

    A_i = r_i - 1/(k-1) sum_{j != i} r_j
    J   = 1/k sum_i A_i log pi(y_i | x)

The KL penalty is part of the reward, as in RLHF: ``r_i <- r_i - beta * sum_t (log pi - log pi_ref)``
(``default_kl_placement``; ``--model.kl.placement loss`` puts a KL term in the loss instead). That is
the k1 estimate; ``kl.estimator`` k2 or k3 puts theirs in the reward instead (as verl's ``kl_penalty``
does). With one optimizer step per rollout the clipped ratio is 1 and the update is exactly
REINFORCE with the leave-one-out baseline.
"""

from __future__ import annotations

from grpo_lightning.training.module import GroupPolicyOptimization
from grpo_lightning.training.options import KLOptions


class RLOO(GroupPolicyOptimization):
    """Leave-one-out baseline; the loss sums over each completion's tokens."""

    inapplicable_options = {"rewards.scale": "its leave-one-out advantage is divided by no std"}

    def __init__(self, model: str, *, kl: KLOptions = KLOptions(beta=0.05), **kwargs) -> None:
        super().__init__(model, kl=kl, **kwargs)

    #: ``r_i <- r_i - beta * sum_t kl_t`` (:func:`grpo_lightning.algorithms.kl.kl_in_reward`), k1 by default.
    default_kl_placement = "reward"
    #: ``r_i - mean_{j != i} r_j``.
    default_advantage = "leave_one_out"
    #: ``1/k sum_i sum_t loss_it`` (the completion's log-prob is the sum of its tokens').
    default_aggregation = "seq_mean_token_sum"

