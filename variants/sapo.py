"""SAPO: Gao et al. 2025, "Soft Adaptive Policy Optimization" (Qwen), arXiv 2511.20347.

The hard clip of GRPO is replaced by a smooth, temperature-controlled gate on the token ratio::

    J = 1/G sum_i 1/|y_i| sum_t f_it(r_it) A_i
    f_it(x) = (4 / tau_it) * sigmoid(tau_it * (x - 1)),   tau_it = tau_pos if A_i > 0 else tau_neg

The gate's slope at ``r = 1`` is 1 for any temperature, so on-policy tokens get the plain policy
gradient ``-A`` (the ``4 / tau`` factor normalises it); as ``r`` leaves 1 the gradient decays
smoothly instead of dropping to zero at a clip boundary. Negative advantages push up the logits
of many unsampled tokens, so their gate decays faster: ``tau_neg > tau_pos``. Advantages and the
aggregation (mean over completions of each one's token mean) are GRPO's. Defaults are the
paper's: tau_pos 1.0, tau_neg 1.05, no KL term. There is no clip: setting ``loss.clip_eps_low``,
``loss.clip_eps_high``, ``loss.delta`` or ``loss.clip_ratio_c`` is an error, and no ``clip_ratio/*`` is logged.
"""

from __future__ import annotations

from grpo_lightning.training.options import KLOptions
from grpo_lightning.errors import require
from grpo_lightning.variants.grpo import GRPO


class SAPO(GRPO):
    """GRPO with a sigmoid soft gate in place of the ratio clip.

    Args:
        tau_pos: gate temperature of tokens with a positive advantage (> 0).
        tau_neg: gate temperature of tokens with a zero or negative advantage (> 0).
    """

    #: ``-(4 / tau) * sigmoid(tau * (r - 1)) * A`` per token; no clip option has a place.
    default_surrogate = "sapo"

    def __init__(self, model: str, *, kl: KLOptions = KLOptions(beta=0.0), tau_pos: float = 1.0, tau_neg: float = 1.05,
                 **kwargs) -> None:  # fmt: skip
        super().__init__(model, kl=kl, **kwargs)
        require(tau_pos > 0, f"tau_pos: the positive-advantage gate temperature must be > 0 (got {tau_pos}).")
        require(tau_neg > 0, f"tau_neg: the negative-advantage gate temperature must be > 0 (got {tau_neg}).")
        self.tau_pos = tau_pos
        self.tau_neg = tau_neg
