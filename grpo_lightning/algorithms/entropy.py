"""The entropy bonus (``entropy_coef``): a per-token term whose gradient raises the policy's entropy."""

from __future__ import annotations

import torch
from torch import Tensor


def entropy_bonus(logp: Tensor, old_logp: Tensor) -> Tensor:
    """``[N, T]``: ``sg(r_t) * sg(log pi_t) * log pi_t``, ``r_t = pi_t / pi_old,t``, whose gradient is
    the score-function estimate of ``-grad H(pi(. | s_t))`` at the sampled token::

        grad H(pi(. | s)) = -E_{y ~ pi} [ log pi(y | s) grad log pi(y | s) ]

    Adding ``entropy_coef`` times it to each token's loss is the entropy bonus ``- entropy_coef * H_t``
    in expectation (the ratio reweights tokens sampled by ``pi_old``). The log-prob passes give the
    exact entropy without a gradient (it is logged as ``entropy``), so the gradient is estimated
    from the sampled tokens: unbiased, noisier than the exact one. Its value is not the entropy."""
    weight = torch.exp(logp.detach() - old_logp)
    return weight * logp.detach() * logp
