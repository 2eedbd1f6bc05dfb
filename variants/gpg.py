"""GPG: Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
Reasoning" (arXiv 2504.02546), Group Policy Gradient.

The plain policy gradient with a group baseline: no ratio, no clip, no KL term, no reference model::

    A_i = alpha (r_i - mean_group(r)) / F_norm,   F_norm = 1,   alpha = B / #{i : r_i != 0}
    L   = 1 / sum_i |o_i| * sum_i sum_t -A_i log pi(o_it)

``alpha`` (``B`` completions of the batch over those rewarded) is verl's ``gpg`` estimator's. It is
meant to make up for the groups of equal rewards, which carry no gradient, but it counts rewarded
completions, not those of groups with different rewards: with 0/1 rewards it is one over the batch's
share of correct completions, so the same informative group weighs 5x more in a batch whose other
groups all failed than in one whose others all passed. The loss is a token mean over the batch.
"""

from __future__ import annotations

from grpo_lightning.training.options import KLOptions
from grpo_lightning.variants.grpo import GRPO


class GPG(GRPO):
    """Group-centred advantages scaled by the batch's rewarded share; REINFORCE; token mean."""

    default_advantage = "gpg"
    default_surrogate = "reinforce"
    default_aggregation = "token_mean"
    inapplicable_options = {"rewards.scale": "its advantage is divided by no std"}

    def __init__(self, model: str, *, kl: KLOptions = KLOptions(beta=0.0), **kwargs) -> None:
        super().__init__(model, kl=kl, **kwargs)
