"""GMPO: Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv 2507.20673.

GRPO maximises the arithmetic mean of a completion's token terms ``r_t A``; one outlier ratio can
dominate it. GMPO maximises their geometric mean, which outliers move far less, with each
token's ratio clipped in log space, one-sided by the sign of the advantage, before the mean::

    J = 1/G sum_i A_i * exp( 1/|o_i| sum_t d'_it )
    d_it  = log pi(o_it) - log pi_old(o_it)
    d'_it = sgn(A_i) * min(sgn(A_i) d_it, sgn(A_i) clip(d_it, -eps_low, eps_high))

``exp(mean_t d'_it)`` is the geometric mean of the clipped ratios. Advantages are GRPO's. The
clip range is the paper's: 0.4 / 0.4 in log space, ratios within
``(e^-0.4, e^0.4)``, wider than GRPO's since the geometric mean is steadier. No KL term.
"""

from __future__ import annotations

from grpo_lightning.training.options import KLOptions, LossOptions
from grpo_lightning.variants.grpo import GRPO


class GMPO(GRPO):
    """GRPO with the geometric mean of per-token, log-space-clipped ratios."""

    #: ``-A_i * exp(mean_t d'_it)`` on every token of sequence ``i``: GRPO's aggregation (a mean over
    #: completions of each one's token mean) then gives ``1/G sum_i -A_i s_i``; ``delta`` has no place.
    default_surrogate = "gmpo"

    def __init__(self, model: str, *, loss: LossOptions = LossOptions(clip_eps_low=0.4, clip_eps_high=0.4),
                 kl: KLOptions = KLOptions(beta=0.0), **kwargs) -> None:  # fmt: skip
        super().__init__(model, loss=loss, kl=kl, **kwargs)
