"""DRO: Richemond et al. 2024, "Offline Regularised Reinforcement Learning for Large Language
Models Alignment" (Direct Reward Optimization), as verl's ``dro`` loss mode takes it on-line.

The policy gradient with a quadratic penalty on the log-ratio in place of a clip: DRO's squared
loss ``1/2 (r - V - tau log(pi / pi_ref))^2`` has the gradient of this, with the group baseline for
``V`` and the sampling policy for the anchor::

    L = -1/B sum_i sum_t [ log pi_it A_i - (beta / 2) (log pi_it - log pi_old,it)^2 ]

(``beta`` is ``dro_beta``; ``beta`` stays the KL coefficient.) On-policy the penalty's gradient is
0 and the update is REINFORCE with GRPO's advantages; the penalty pulls back tokens that moved.
Defaults: ``dro_beta`` 0.1, GRPO advantages, the token sum per completion averaged over
completions (the equation above; verl's default is the token mean), no KL term.
"""

from __future__ import annotations

from grpo_lightning.training.options import KLOptions
from grpo_lightning.errors import require
from grpo_lightning.variants.grpo import GRPO


class DRO(GRPO):
    """GRPO advantages; log-likelihood with a quadratic log-ratio penalty.

    Args:
        dro_beta: weight of ``(log pi - log pi_old)^2 / 2`` (>= 0).
    """

    default_surrogate = "dro"
    default_aggregation = "seq_mean_token_sum"

    def __init__(self, model: str, *, kl: KLOptions = KLOptions(beta=0.0), dro_beta: float = 0.1, **kwargs) -> None:
        super().__init__(model, kl=kl, **kwargs)
        require(dro_beta >= 0, f"dro_beta: the quadratic penalty's weight must be >= 0 (got {dro_beta}).")
        self.dro_beta = dro_beta
