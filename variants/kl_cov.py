"""KL-Cov: Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models" (arXiv 2505.22617), section 5.

With ``Cov(y_t)`` the centred covariance of each valid token (``variants/covariance.py``) over the
``N`` valid tokens of the minibatch, the top fraction ``k`` of tokens by covariance is held to the
rollout policy by a KL penalty, ``|log pi_theta - log pi_old|`` per token::

    I_KL = {t : Rank(Cov(y_t)) <= k * N}
    L(theta) = 1/N sum_t { -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)                  t not in I_KL
                         { the same + beta_KL * |log pi_theta(y_t) - log pi_old(y_t)|                  t in I_KL

Advantages are GRPO's, the loss a token mean (the authors' ``token-mean``). Defaults are the
paper's Qwen2.5-7B run: k = 2e-3 (2e-4 for 32B), beta_KL (``kl_coef``) = 1, clip 0.2 / 0.2, no KL
to a reference model (beta 0). The paper's equation has no PPO clip (``rho_t A_t``); with one
update per rollout (its setting) rho = 1 and the two agree. At least one token is penalised, as in
the authors' code.

The penalty's gradient is 0 where pi_theta = pi_old: with one optimizer step per rollout the old
log-probs are the current ones and KL-Cov changes nothing. It acts once the policy has moved away
from the rollout's: ``minibatch_size`` below the rollout size, or ``ppo_epochs`` > 1. The tokens
are chosen once per minibatch, so the gradient does not depend on the micro-batch size (see
``variants/covariance.py``); ``torch.topk`` breaks ties.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo_lightning.algorithms import functional
from grpo_lightning.rollout.types import MicroBatch
from grpo_lightning.errors import require
from grpo_lightning.variants.covariance import CovarianceRule, kl_cov_tokens, token_covariance


class KLCov(CovarianceRule):
    """GRPO with a KL penalty on the tokens of largest covariance.

    Args:
        kl_cov_ratio: ``k``, the share of the minibatch's valid tokens penalised.
        kl_coef: ``beta_KL``, the weight of ``|log pi_theta - log pi_old|`` on them.
    """

    def __init__(self, model: str, *, kl_cov_ratio: float = 2e-3, kl_coef: float = 1.0, **kwargs) -> None:
        super().__init__(model, **kwargs)
        require(
            0 < kl_cov_ratio <= 1,
            f"kl_cov_ratio: the share of tokens to penalise must be in (0, 1] (the paper: 2e-3), got {kl_cov_ratio}.",
        )
        require(kl_coef >= 0, f"kl_coef: the KL-Cov penalty weight must be >= 0 (the paper: 1), got {kl_coef}.")
        self.kl_cov_ratio = kl_cov_ratio
        self.kl_coef = kl_coef

    def choose_tokens(self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
        """``I_KL`` of one minibatch."""
        return kl_cov_tokens(token_covariance(logp, advantages, mask), mask, self.kl_cov_ratio)

    def token_loss(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, micro: MicroBatch | None = None
    ) -> Tensor:
        """The clipped surrogate, plus ``kl_coef * |logp - old_logp|`` on ``I_KL``."""
        loss = super().token_loss(logp, old_logp, advantages, mask)  # the base's clipped surrogate
        penalised = self.chosen(logp, old_logp, advantages, mask, micro)
        fraction = functional.masked_mean(penalised.to(logp.dtype), mask)
        self.step_metrics.update("kl_cov/penalised_frac", fraction, mask.sum())
        penalty = self.kl_coef * (logp - old_logp).abs()
        return loss + torch.where(penalised, penalty, torch.zeros_like(penalty))
