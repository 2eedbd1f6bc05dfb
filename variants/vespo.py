"""VESPO: "VESPO: Variational Sequence-Level Soft Policy Optimization for Stable Off-Policy LLM
Training" (arXiv 2602.10693).

No ratio clip: each completion's log-likelihood is weighted by a detached, gamma-shaped function of
its sequence importance weight ``w_i`` (not length-normalised), which is 1 on-policy and falls off
as the sequence drifts from the policy that sampled it::

    log w_i = clamp( sum_t m_it clamp(log pi_it - log pi_old,it, -20, 20), ln 1e-8, 20 )
    phi_i   = exp(lambda + k log w_i - lambda w_i),    (k, lambda) = (2, 3) if A_i >= 0 else (3, 2)
    L       = 1 / sum_i |o_i| * sum_i sum_t -sg(phi_i) A_i log pi_it

``phi(1) = 1`` for both signs; ``A >= 0``: ``phi(0.5) = 1.1204``, ``phi(2) = 0.1991``; ``A < 0``:
``phi(0.5) = 0.3398``, ``phi(2) = 1.0827``. Advantages are GRPO's, the loss a token mean over the
batch; defaults (the ``k``, ``lambda`` above, no KL term) are the paper's as TRL ships them.
The paper folds the rollout engine's ratio into ``w_i``; this preset refuses ``rollout_correction``.
"""

from __future__ import annotations

from grpo_lightning.training.options import KLOptions
from grpo_lightning.errors import require
from grpo_lightning.variants.grpo import GRPO


class VESPO(GRPO):
    """GRPO advantages; the log-likelihood weighted by a gamma kernel of the sequence's IS weight.

    Args:
        k_pos, lambda_pos: the kernel's shape where ``A >= 0`` (> 0).
        k_neg, lambda_neg: the kernel's shape where ``A < 0`` (> 0).
    """

    default_surrogate = "vespo"
    #: ``sum(loss * mask) / sum(mask)`` over the whole batch.
    default_aggregation = "token_mean"
    inapplicable_options = {"sampling.correction": "its weight w_i would have to take the engine's ratio in"}

    def __init__(self, model: str, *, kl: KLOptions = KLOptions(beta=0.0), k_pos: float = 2.0, lambda_pos: float = 3.0,
                 k_neg: float = 3.0, lambda_neg: float = 2.0, **kwargs) -> None:  # fmt: skip
        super().__init__(model, kl=kl, **kwargs)
        for name, value in (("k_pos", k_pos), ("lambda_pos", lambda_pos), ("k_neg", k_neg), ("lambda_neg", lambda_neg)):
            require(value > 0, f"{name}: the VESPO kernel's shapes must be > 0 (got {value}).")
        self.k_pos, self.lambda_pos, self.k_neg, self.lambda_neg = k_pos, lambda_pos, k_neg, lambda_neg
