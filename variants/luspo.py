"""LUSPO: "Length-Unbiased Sequence Policy Optimization: Revealing and Controlling Response Length
Variation in RLVR" (2026).

GSPO's sequence ratio and clip, with each sequence's loss weighted by its length, so that the
length normalisation inside the ratio no longer biases the update against long responses::

    s_i = exp( 1/|o_i| sum_t m_it (log pi_it - log pi_old,it) )
    l_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)
    L   = 1/B sum_i |o_i| l_i

``l_i`` on each of sequence ``i``'s tokens, summed per sequence and averaged over sequences, is
``|o_i| l_i / B``: GSPO's surrogate with the ``seq_mean_token_sum`` aggregation. On-policy the
gradient is ``-1/B sum_i A_i sum_t grad log pi_it``. Advantages are GRPO's. Defaults are the
paper's: eps 2e-3 / 2.5e-3, no KL term.
"""

from __future__ import annotations

from grpo_lightning.training.options import KLOptions, LossOptions
from grpo_lightning.variants.grpo import GRPO


class LUSPO(GRPO):
    """GSPO's clipped sequence ratio, each sequence's loss weighted by its length."""

    default_surrogate = "gspo"
    #: ``1/B sum_i sum_t loss_it`` = ``1/B sum_i |o_i| l_i``.
    default_aggregation = "seq_mean_token_sum"

    def __init__(self, model: str, *, loss: LossOptions = LossOptions(clip_eps_low=2e-3, clip_eps_high=2.5e-3),
                 kl: KLOptions = KLOptions(beta=0.0), **kwargs) -> None:  # fmt: skip
        super().__init__(model, loss=loss, kl=kl, **kwargs)
