"""The covariance rule shared by Clip-Cov and KL-Cov: Cui et al. 2025, "The Entropy Mechanism of
Reinforcement Learning for Reasoning Language Models" (arXiv 2505.22617), section 5.

Over the ``N`` valid tokens ``y_t`` of a batch, each token's centred covariance term is::

    Cov(y_t) = (log pi_theta(y_t) - 1/N sum_j log pi_theta(y_j)) * (A(y_t) - 1/N sum_j A(y_j))

A few tokens of largest covariance (those that drive entropy down) are singled out per batch:
Clip-Cov picks them at random within a covariance range, KL-Cov takes the top ones.

The batch is the optimizer step's minibatch, never a micro-batch: ``minibatch_derived`` (which
sees the whole minibatch before it is split) chooses the tokens once, from one extra no-grad pass
of the current policy over the minibatch's rows, and every micro-batch's ``token_loss`` reads its
rows of that choice (``micro.derived``); so the gradient does not depend on ``micro_batch_size``.
The authors' code chooses per micro-batch instead. Over several devices each device chooses among
its own tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo_lightning.algorithms import functional
from grpo_lightning.training.options import KLOptions
from grpo_lightning.rollout.types import MicroBatch, Rollout
from grpo_lightning.variants.grpo import GRPO


def token_covariance(logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """``Cov(y_t)`` above, ``[N, T]`` (0 on padding); ``advantages`` ``[N]`` or ``[N, T]``.
    The means are over the valid tokens of the whole batch; no gradient flows through it."""
    logp = logp.detach()
    advantages = (advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages).expand_as(logp).to(logp)
    centred_logp = logp - functional.masked_mean(logp, mask)
    centred_advantages = advantages - functional.masked_mean(advantages, mask)
    return torch.where(mask.bool(), centred_logp * centred_advantages, torch.zeros_like(logp))


def selection_size(ratio: float, mask: Tensor) -> int:
    """Tokens a rule picks: ``floor(ratio * N)`` for ``N`` valid tokens, but at least one when
    ``N > 0`` (as the authors' code does: a small batch still sees the rule)."""
    valid = int(mask.bool().sum())
    return max(1, int(ratio * valid)) if valid else 0


def top_tokens(score: Tensor, k: int) -> Tensor:
    """Boolean ``[N, T]``, true on the ``k`` largest entries of ``score``."""
    chosen = torch.zeros(score.numel(), dtype=torch.bool, device=score.device)
    chosen[score.flatten().topk(k).indices] = True
    return chosen.view_as(score)


def clip_cov_tokens(
    cov: Tensor, mask: Tensor, ratio: float, low: float, high: float, generator: torch.Generator,
    exclude: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """``I_clip``: ``selection_size(ratio)`` tokens drawn uniformly at random, without
    replacement, among the valid tokens with ``low <= Cov <= high`` (fewer if fewer are in range),
    leaving out ``exclude``. The draw is ``generator``'s (CPU): the same seed chooses the same tokens."""
    candidates = mask.bool() & (cov >= low) & (cov <= high)
    if exclude is not None:
        candidates &= ~exclude
    keys = torch.rand(cov.shape, generator=generator, dtype=torch.float64).to(cov.device)
    k = min(selection_size(ratio, mask), int(candidates.sum()))
    return top_tokens(keys.masked_fill(~candidates, -1.0), k)


def kl_cov_tokens(cov: Tensor, mask: Tensor, ratio: float) -> Tensor:
    """``I_KL``: the ``selection_size(ratio)`` valid tokens of largest ``Cov``."""
    return top_tokens(cov.masked_fill(~mask.bool(), float("-inf")), selection_size(ratio, mask))


class CovarianceRule(GRPO):
    """GRPO advantages, DAPO's token mean, and a token choice made once per minibatch.

    Subclasses define ``choose_tokens`` (the paper's index set for one minibatch) and read it in
    ``token_loss`` through ``chosen``.
    """

    #: ``sum(loss * mask) / sum(mask)`` over the whole minibatch (the authors' ``token-mean``).
    default_aggregation = "token_mean"
    #: The name of the minibatch's choice ``[N, T]`` in ``micro.derived``.
    CHOICE = "covariance_tokens"

    def __init__(self, model: str, *, kl: KLOptions = KLOptions(beta=0.0), **kwargs) -> None:
        super().__init__(model, kl=kl, **kwargs)

    def choose_tokens(self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
        """Boolean ``[n, T]``: the tokens of one minibatch the rule applies to."""
        raise NotImplementedError

    def minibatch_derived(self, rollout: Rollout, advantages: Tensor, rows: Tensor) -> dict[str, Tensor]:
        """The tokens of the minibatch ``rows`` chosen from the current policy's log-probs (a no-grad
        pass), ``[N, T]`` over the rollout."""
        rows = rows.to(rollout.completion_mask.device)
        # The tokens that carry loss: the base's loss_mask where it has one (it may leave some out).
        mask = self.loss_mask(rollout, rows)
        logp = self.compute_logprobs(self.policy, rollout.select(rows))
        old_logp = logp if rollout.old_logp is None else rollout.old_logp[rows]
        choice = torch.zeros_like(rollout.completion_mask, dtype=torch.bool)
        choice[rows] = self.choose_tokens(logp, old_logp, advantages[rows], mask)
        return {self.CHOICE: choice}

    def chosen(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, micro: MicroBatch | None
    ) -> Tensor:
        """The micro-batch's rows of its minibatch's choice; on tensors alone (no minibatch chose),
        the tokens given are the batch."""
        if micro is None or self.CHOICE not in micro.derived:
            return self.choose_tokens(logp.detach(), old_logp, advantages, mask) & mask.bool()
        return micro.derived[self.CHOICE] & mask.bool()
