"""CISPO: MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
Attention", section 3.1 (arXiv 2506.13585).

PPO and GRPO drop the gradient of every token whose ratio leaves the clip range, and the rare,
low-probability "fork" tokens (``However``, ``Wait``) are the first to go. CISPO clips the
importance-sampling weight instead and keeps every token's gradient (eqs. 4-5)::

    J = 1 / sum_i |o_i| * sum_i sum_t sg(w_it) A_i log pi(o_it | q, o_i,<t)
    w_it = clip(r_it, 1 - eps_low, 1 + eps_high),   r_it = pi(o_it) / pi_old(o_it)

``sg`` is the stop-gradient: ``d(-J) / d log pi_it = -w_it A_i`` for every token, clipped or
not; at ``r = 1`` that is the plain policy gradient ``-A_i``. Advantages are GRPO's (eq. 2); the
loss is a token mean over the whole batch, as in DAPO. No KL term (beta 0).

Clip range: the paper imposes no lower bound (its ``eps_low`` is set large) and tunes only
``eps_high`` without publishing the value. ``loss.clip_eps_low`` defaults to ``None``, no lower bound
(the same as ``1.0``: the weight is never below 0); ``loss.clip_eps_high`` defaults to 5.0, the
value TRL documents for its CISPO loss (following ScaleRL, Khatri et al. 2025), so a weight is
truncated only when a token grew more than six-fold since sampling.
"""

from __future__ import annotations

from grpo_lightning.training.options import KLOptions, LossOptions
from grpo_lightning.variants.grpo import GRPO


class CISPO(GRPO):
    """GRPO advantages; a clipped, detached IS weight on each token's log-likelihood; token mean.

    ``loss.clip_eps_low``: lower bound ``1 - clip_eps_low`` of the weight, in ``[0, 1)``; ``None``
    (default) is no lower bound, as in the paper. ``loss.clip_eps_high``: its upper bound ``1 + clip_eps_high``.
    """

    #: ``sum(loss * mask) / sum(mask)`` over the whole batch (eq. 4's ``1 / sum_i |o_i|``).
    default_aggregation = "token_mean"
    #: ``-sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi`` per token (eqs. 4-5); ``delta`` has no place.
    default_surrogate = "cispo"

    def __init__(self, model: str, *, loss: LossOptions = LossOptions(clip_eps_low=None, clip_eps_high=5.0),
                 kl: KLOptions = KLOptions(beta=0.0), **kwargs) -> None:  # fmt: skip
        super().__init__(model, loss=loss, kl=kl, **kwargs)
