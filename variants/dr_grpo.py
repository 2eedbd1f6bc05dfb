"""Dr. GRPO: Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective",
section 3.2.

GRPO's per-response length normaliser ``1/|o_i|`` and the std in the advantage bias
optimisation (towards long wrong answers and towards questions of low reward variance). Dr. GRPO
removes both (eq. 3)::

    A_i = r_i - mean(r)
    J   = 1/(G * L) sum_i sum_t min(r_it A_i, clip(r_it, 1 - eps, 1 + eps) A_i)

with a constant normaliser ``L = max_new_tokens``. No KL term (beta 0).
"""

from __future__ import annotations

from grpo_lightning.training.options import KLOptions
from grpo_lightning.training.module import GroupPolicyOptimization


class DrGRPO(GroupPolicyOptimization):
    """Group-centred advantages and a constant, length-independent normaliser."""

    inapplicable_options = {"rewards.scale": "its advantage r - mean is divided by no std"}

    def __init__(self, model: str, *, kl: KLOptions = KLOptions(beta=0.0), **kwargs) -> None:
        super().__init__(model, kl=kl, **kwargs)

    #: ``r - mean_g`` (no division by the group std).
    default_advantage = "group_mean"
    #: ``sum(loss * mask) / (N * max_new_tokens)``.
    default_aggregation = "seq_mean_token_sum_norm"
