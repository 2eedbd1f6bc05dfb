"""MaxRL: "Maximum Likelihood Reinforcement Learning" (prime-rl's ``max_rl``).

With 0/1 rewards, ``grad log p(success | x) = E[r grad log pi] / p``: dividing the centred reward
by the group's success rate ``p`` (its mean reward) instead of its std follows the likelihood of
success, so prompts the policy rarely solves weigh more::

    A_i = (r_i - mean_group(r)) / (mean_group(r) + 1e-6)

Everything else is GRPO's (eq. 3: token-level clip 0.2 / 0.2, mean over completions of each one's
token mean); no KL term. Rewards must not be negative (a group with a mean <= 0 whose rewards
differ is an error), so ``reward_aggregation: normalize_then_sum`` has no place.
"""

from __future__ import annotations

from grpo_lightning.training.options import KLOptions
from grpo_lightning.variants.grpo import GRPO


class MaxRL(GRPO):
    """GRPO whose advantage divides by the group's success rate instead of its std."""

    default_advantage = "max_rl"
    inapplicable_options = {
        "rewards.scale": "its advantage is divided by the group's mean, not a std",
        "rewards.aggregation": "its advantage divides by the mean reward, a success rate; normalised rewards are not",
    }

    def __init__(self, model: str, *, kl: KLOptions = KLOptions(beta=0.0), **kwargs) -> None:
        super().__init__(model, kl=kl, **kwargs)
