"""Rollout/training mismatch: the sampled tokens' log-probabilities as the rollout engine computed
them, ``log pi_rollout``, against the training forward pass's, ``log pi_train`` (the policy that
sampled, recomputed), and the importance-sampling correction of the policy loss for it.

With ``rho_t = pi_train(y_t) / pi_rollout(y_t)``, the loss of token ``t`` is weighted by
(``cap`` = ``C``):

- ``token_truncate``: ``min(rho_t, C)``, truncated importance sampling (TIS; Yao et al. 2025,
  "Your efficient RL framework secretly brings you off-policy RL training");
- ``token_mask``: ``1[rho_t <= C]``, masked importance sampling (MIS): tokens the engines disagree
  on carry no loss;
- ``sequence_truncate`` / ``sequence_mask``: the same with the completion's ratio
  ``rho = prod_t rho_t`` for all of its tokens.

Off by default: measured on W1 (benchmarks/RESULTS.md), both engines agree with the training pass
to about 0.01 nats per token (ratios within [0.95, 1.05]) in bf16, and with fp32 weights and a
bf16 rollout copy alike, so a cap of 2 never binds there.

Metric names are TRL's (``sampling/sampling_logp_difference/*``, ``sampling/importance_sampling_ratio/*``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

#: Values of ``rollout_correction`` besides ``None`` (off).
CORRECTIONS = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def importance_ratio(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, level: str) -> Tensor:
    """``rho`` ``[N, T]``: per token (``level="token"``), or the completion's product over its
    masked tokens broadcast to each of them (``"sequence"``); 1 outside ``mask``."""
    log_ratio = (train_logp.detach() - sampling_logp) * mask
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(mask)
    return torch.where(mask > 0, log_ratio.exp(), torch.ones_like(log_ratio))


def correction_weights(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, mode: str, cap: float) -> Tensor:
    """Weights ``[N, T]`` of the per-token policy loss for ``mode`` (one of :data:`CORRECTIONS`)."""
    if mode not in CORRECTIONS:
        raise ValueError(f"rollout_correction: {mode!r} is not one of {', '.join(CORRECTIONS)} or null")
    level, kind = mode.split("_")
    rho = importance_ratio(train_logp, sampling_logp, mask, level)
    return rho.clamp(max=cap) if kind == "truncate" else (rho <= cap).to(rho.dtype)


def mismatch_metrics(train_logp: Tensor, sampling_logp: Tensor, mask: Tensor) -> dict[str, tuple[Tensor, str]]:
    """``name -> (value, reduce)`` over the masked tokens: ``|log pi_train - log pi_rollout|`` (mean,
    max) and the token ratio ``rho_t`` (min, mean, max)."""
    kept = mask > 0
    difference = train_logp.detach() - sampling_logp
    ratio, gap, tokens = difference.exp(), difference.abs(), mask.sum()  # no host synchronisation
    return {
        "sampling/sampling_logp_difference/mean": ((gap * mask).sum() / tokens, "mean"),
        "sampling/sampling_logp_difference/max": (gap.masked_fill(~kept, float("-inf")).max(), "max"),
        "sampling/importance_sampling_ratio/min": (ratio.masked_fill(~kept, float("inf")).min(), "min"),
        "sampling/importance_sampling_ratio/mean": ((ratio * mask).sum() / tokens, "mean"),
        "sampling/importance_sampling_ratio/max": (ratio.masked_fill(~kept, float("-inf")).max(), "max"),
    }


def correct_policy_loss(
    loss: Tensor, train_logp: Tensor, sampling_logp: Tensor, mask: Tensor, mode: str | None, cap: float, metrics: Any
) -> Tensor:
    """Log the mismatch (:func:`mismatch_metrics`) into the step's ``metrics`` and return the
    per-token ``loss`` weighted for ``mode`` (unchanged when it is ``None``)."""
    for name, (value, reduce) in mismatch_metrics(train_logp, sampling_logp, mask).items():
        metrics.update(name, value, mask.sum() if reduce == "mean" else 1.0, reduce=reduce)
    return loss if mode is None else loss * correction_weights(train_logp, sampling_logp, mask, mode, cap)
