"""GRPO: Shao et al. 2024, "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
Language Models", section 4.1.

Objective (eq. 3), with outcome supervision and the k3 KL estimator (eq. 4)::

    J = 1/G sum_i 1/|o_i| sum_t { min(r_it A_i, clip(r_it, 1 - eps, 1 + eps) A_i) - beta * D_KL,t }
    A_i = (r_i - mean(r)) / std(r)

Defaults are the paper's: eps 0.2, beta 0.04, k3.
"""

from __future__ import annotations

from grpo_lightning.training.module import GroupPolicyOptimization


class GRPO(GroupPolicyOptimization):
    """Group-normalised advantages; each completion's token mean, averaged over completions."""

    #: ``(r - mean_g) / (std_g + 1e-4)``, unbiased std; 0 for groups of equal rewards
    #: (``scale_rewards``: the std of the group, of the batch, or none).
    default_advantage = "group_std"
    #: ``1/G sum_i 1/|o_i| sum_t loss_it`` (eq. 3).
    default_aggregation = "seq_mean_token_mean"
