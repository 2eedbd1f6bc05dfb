"""REINFORCE++ (baseline form): Hu et al. 2025, "REINFORCE++: Stabilizing Critic-Free Policy
Optimization with Global Normalization" (arXiv 2501.03262), "REINFORCE++ w/ Baseline".

The group mean is the baseline, and the scale is that of the whole batch, not of each prompt's
group (global advantage normalisation)::

    A'_i = r_i - mean_group(r)
    A_i  = (A'_i - mean_batch(A')) / std_batch(A')

``mean_batch(A')`` is 0 already; ``std_batch`` is the unbiased std of all ``P * G`` centred
rewards of the batch (on each device, its share). Groups of equal task rewards get 0 only with
``beta`` 0: the KL penalty below is part of ``r``, so their completions still differ by their KL,
and the batch std divides that difference too (where the task rewards vary little, the KL term
weighs more than ``beta`` says). The policy loss is PPO's clipped surrogate (eps 0.2), averaged over
every token of the batch.

KL: as in the paper, the k1 estimate ``log pi_old - log pi_ref`` is a penalty in the reward, not
a loss term. The paper subtracts it per token, ``r_t = 1[t = T] r - beta * k1_t``, with returns
summed to the end; here advantages are one per completion, so the penalty is its whole-sequence
sum, the return at the first token (as RLOO does): ``r_i <- r_i - beta * sum_t k1_it``. A
per-token return would need token-level advantages, which the hooks do not carry. ``beta`` 0.01
is our default (the paper sets it per experiment); ``--model.kl.placement loss`` moves the KL into
the loss instead. ``kl.estimator``: k1 in the reward and k3 in the loss by default; either acts where
the KL is.
"""

from __future__ import annotations

from grpo_lightning.training.module import GroupPolicyOptimization
from grpo_lightning.training.options import KLOptions


class ReinforcePlusPlus(GroupPolicyOptimization):
    """Group-mean baseline, batch-wide std; k1 KL in the reward; PPO clip; token mean."""

    inapplicable_options = {"rewards.scale": "its advantage is divided by the batch's std by definition"}

    def __init__(self, model: str, *, kl: KLOptions = KLOptions(beta=0.01), **kwargs) -> None:
        super().__init__(model, kl=kl, **kwargs)

    #: ``r_i <- r_i - beta * sum_t kl_t``: RLOO's penalty, the same equation (k1 by default).
    default_kl_placement = "reward"
    #: ``(r - mean_group) / std_batch(r - mean_group)``; 0 where that std is 0.
    default_advantage = "batch_std"
    #: ``sum(loss * mask) / sum(mask)`` over the whole batch.
    default_aggregation = "token_mean"
