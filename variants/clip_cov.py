"""Clip-Cov: Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models" (arXiv 2505.22617), section 5.

With ``Cov(y_t)`` the centred covariance of each valid token (``variants/covariance.py``) over the
``N`` valid tokens of the minibatch, a fraction ``r`` of them, drawn at random among those whose
covariance lies in ``[omega_low, omega_high]``, is cut off from the gradient::

    I_clip = ``floor(r * N)`` indices drawn uniformly from {t : omega_low <= Cov(y_t) <= omega_high}
    L(theta) = 1/N sum_t { -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)   t not in I_clip
                         { the same, detached (no gradient)                                t in I_clip

Advantages are GRPO's, the loss a token mean (the authors' ``token-mean``). Defaults are the
paper's: r = 2e-4, omega_low = 1, omega_high = 5, no KL term (beta 0). The clipped surrogate keeps
the usual 0.2 / 0.2: the authors' script widens it to 1 / 1 (no PPO clip at all, as the paper's
equation has), which this package's ``clip_eps_low < 1`` refuses; ``--model.loss.clip_eps_high 1``
lifts the upper side. As in the authors' code, at least one token is detached when any is in
range, and tokens the PPO clip already stops (no gradient anyway) are not candidates. A detached
token keeps its loss value (the authors zero it; the gradient is the same).

Randomness: a ``torch.Generator`` seeded from ``clip_cov_seed``, the optimizer step
(``global_step``) and the process's rank draws the tokens, never the global generator; so runs,
resumes and tests are reproducible, and the draw does not depend on the micro-batch size (it is
made once per minibatch, see ``variants/covariance.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo_lightning.algorithms import functional
from grpo_lightning.algorithms import policy_losses
from grpo_lightning.rollout.types import MicroBatch
from grpo_lightning.errors import require
from grpo_lightning.variants.covariance import CovarianceRule, clip_cov_tokens, token_covariance


class ClipCov(CovarianceRule):
    """GRPO whose loss detaches a random few high-covariance tokens.

    Args:
        clip_cov_ratio: ``r``, the share of the minibatch's valid tokens detached.
        clip_cov_lb, clip_cov_ub: ``[omega_low, omega_high]``, the covariance range drawn from.
        clip_cov_seed: seed of the draw (with the optimizer step and the rank).
    """

    inapplicable_options = {"loss.surrogate": "its candidates leave out the tokens PPO's clip stops: it is ppo_clip's"}

    def __init__(
        self,
        model: str,
        *,
        clip_cov_ratio: float = 2e-4,
        clip_cov_lb: float = 1.0,
        clip_cov_ub: float = 5.0,
        clip_cov_seed: int = 0,
        **kwargs,
    ) -> None:
        super().__init__(model, **kwargs)
        require(
            0 < clip_cov_ratio <= 1,
            f"clip_cov_ratio: the share of tokens to detach must be in (0, 1] (the paper: 2e-4), got {clip_cov_ratio}.",
        )
        require(
            clip_cov_lb < clip_cov_ub,
            f"clip_cov_lb, clip_cov_ub: the covariance range needs clip_cov_lb < clip_cov_ub (the paper: 1 and 5), "
            f"got {clip_cov_lb} and {clip_cov_ub}.",
        )
        self.clip_cov_ratio = clip_cov_ratio
        self.clip_cov_lb = clip_cov_lb
        self.clip_cov_ub = clip_cov_ub
        self.clip_cov_seed = clip_cov_seed

    def generator(self) -> torch.Generator:
        """The draw's generator: a function of the seed, the optimizer step and the rank only."""
        return torch.Generator().manual_seed((self.clip_cov_seed * 1_000_003 + self.global_step) * 1_009 + self.global_rank)

    def choose_tokens(self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
        """``I_clip`` of one minibatch."""
        low, high = self.settings.clip_eps_low, self.settings.clip_eps_high
        _, clipped_low, clipped_high = policy_losses.clipped_surrogate(logp, old_logp, advantages, low, high)
        cov = token_covariance(logp, advantages, mask)
        return clip_cov_tokens(cov, mask, self.clip_cov_ratio, self.clip_cov_lb, self.clip_cov_ub, self.generator(),
                               exclude=clipped_low | clipped_high)  # fmt: skip

    def token_loss(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, micro: MicroBatch | None = None
    ) -> Tensor:
        """The clipped surrogate, detached on ``I_clip``."""
        loss = super().token_loss(logp, old_logp, advantages, mask)  # the base's clipped surrogate
        detached = self.chosen(logp, old_logp, advantages, mask, micro)
        fraction = functional.masked_mean(detached.to(logp.dtype), mask)
        self.step_metrics.update("clip_cov/detached_frac", fraction, mask.sum())
        return torch.where(detached, loss.detach(), loss)
