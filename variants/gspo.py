"""GSPO: Zheng et al. 2025, "Group Sequence Policy Optimization" (Qwen), section 4.

The importance ratio is taken per sequence, length-normalised (eq. 7), and clipped per sequence::

    s_i = (pi(y_i|x) / pi_old(y_i|x)) ** (1/|y_i|) = exp(1/|y_i| sum_t log(pi_t / pi_old,t))
    J   = 1/G sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)

Advantages are GRPO's. The clip range is the paper's (3e-4, 4e-4): sequence ratios stay close to
1, so the range is far narrower than a token-level one. No KL term.
"""

from __future__ import annotations

from grpo_lightning.training.options import KLOptions, LossOptions
from grpo_lightning.variants.grpo import GRPO


class GSPO(GRPO):
    """GRPO with a sequence-level, clipped importance ratio."""

    #: ``-min(s_i A_i, clip(s_i) A_i)`` on every token of sequence ``i`` (eqs. 5-7); ``delta`` has no place.
    default_surrogate = "gspo"

    def __init__(self, model: str, *, loss: LossOptions = LossOptions(clip_eps_low=3e-4, clip_eps_high=4e-4),
                 kl: KLOptions = KLOptions(beta=0.0), **kwargs) -> None:  # fmt: skip
        super().__init__(model, loss=loss, kl=kl, **kwargs)
