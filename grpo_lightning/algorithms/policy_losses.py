"""Pure tensor policy losses of the GRPO family: per-token losses from the ratio and the advantages.

Each takes ``logp``, ``old_logp`` ``[N, T]`` with the ratio ``rho = exp(logp - old_logp)``, and returns
the loss neither masked nor aggregated. Shapes and dtypes follow :mod:`grpo_lightning.algorithms.functional`.

References:

* PPO: Schulman et al. 2017, "Proximal Policy Optimization Algorithms"; GRPO: Shao et al. 2024,
  "DeepSeekMath"; DAPO: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale".
* GSPO: Zheng et al. 2025, "Group Sequence Policy Optimization".
* CISPO: MiniMax 2025, "MiniMax-M1"; SAPO: Gao et al. 2025, "Soft Adaptive Policy Optimization";
  GMPO: Zhao et al. 2025, "Geometric-Mean Policy Optimization".
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from grpo_lightning.algorithms.functional import masked_mean

__all__ = [
    "clipped_surrogate",
    "sequence_clipped_surrogate",
    "clipped_weight_log_likelihood",
    "soft_gated_surrogate",
    "geometric_mean_surrogate",
]


def _check_clip(eps_low: float, eps_high: float) -> None:
    if eps_low < 0 or eps_high < 0:
        raise ValueError(
            f"clip ranges must be non-negative, got eps_low={eps_low}, eps_high={eps_high}"
        )


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: float,
    eps_high: float,
    delta: Optional[float] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Per-token clipped policy-gradient loss (PPO eq. 7, DeepSeekMath eq. 3;
    decoupled bounds as in DAPO eq. 10).

    ``logp``, ``old_logp``: ``[N, T]``; ``advantages``: ``[N]`` (broadcast over tokens)
    or ``[N, T]``. With ``rho = exp(logp - old_logp)``::

        loss = -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)

    ``delta`` (two-sided clipping, as TRL's ``delta``) also caps the unclipped term where
    ``A < 0`` lets ``rho`` grow without bound: ``loss = -min(min(rho, delta) * A, clip(rho) * A)``.

    Returns ``(loss, clipped_low, clipped_high)``, all ``[N, T]``; the loss is neither
    masked nor aggregated. ``clipped_low = (rho < 1 - eps_low) & (A < 0)`` and
    ``clipped_high = (rho > 1 + eps_high) & (A > 0)`` mark the tokens where the clip
    binds (and the gradient is zero).
    """
    _check_clip(eps_low, eps_high)
    if advantages.dim() == logp.dim() - 1:
        advantages = advantages.unsqueeze(-1)
    if delta is not None and not delta > 1.0 + eps_high:
        raise ValueError(f"delta must exceed 1 + eps_high = {1.0 + eps_high}, got {delta}")
    ratio = torch.exp(logp - old_logp)
    clipped_ratio = ratio.clamp(min=1.0 - eps_low, max=1.0 + eps_high)
    capped_ratio = ratio if delta is None else ratio.clamp(max=delta)
    loss = -torch.minimum(capped_ratio * advantages, clipped_ratio * advantages)
    clipped_low = (ratio < 1.0 - eps_low) & (advantages < 0)
    clipped_high = (ratio > 1.0 + eps_high) & (advantages > 0)
    return loss, clipped_low, clipped_high


def sequence_clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """GSPO sequence-level clipped loss (GSPO eqs. 5-7).

    ``logp``, ``old_logp``, ``mask``: ``[N, T]``; ``advantages``: ``[N]``. The
    length-normalised sequence importance ratio is::

        s_i = exp( sum_t mask_{i,t} * (logp_{i,t} - old_logp_{i,t}) / max(|y_i|, 1) )
        loss_i = -min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i)

    ``loss_i`` is broadcast to every token of row ``i`` (``[N, T]``), so a per-sequence
    token mean (:func:`sequence_mean_token_mean`) returns exactly ``loss_i``.
    Returns ``(loss, clipped_low, clipped_high)``, each ``[N, T]``, with
    ``clipped_low = (s < 1 - eps_low) & (A < 0)`` and
    ``clipped_high = (s > 1 + eps_high) & (A > 0)`` broadcast likewise. An empty row
    has ``s_i = 1``.
    """
    _check_clip(eps_low, eps_high)
    n = logp.shape[0]
    if advantages.numel() != n:
        raise ValueError(
            f"sequence_clipped_surrogate: advantages must have one value per row ({n}), "
            f"got shape {tuple(advantages.shape)}"
        )
    advantages = advantages.reshape(n)
    log_ratio = masked_mean(logp - old_logp, mask, dim=-1)
    seq_ratio = torch.exp(log_ratio)
    clipped_ratio = seq_ratio.clamp(min=1.0 - eps_low, max=1.0 + eps_high)
    seq_loss = -torch.minimum(seq_ratio * advantages, clipped_ratio * advantages)
    clipped_low = (seq_ratio < 1.0 - eps_low) & (advantages < 0)
    clipped_high = (seq_ratio > 1.0 + eps_high) & (advantages > 0)
    shape = logp.shape
    return (
        seq_loss.unsqueeze(-1).expand(shape).contiguous(),
        clipped_low.unsqueeze(-1).expand(shape).contiguous(),
        clipped_high.unsqueeze(-1).expand(shape).contiguous(),
    )


def clipped_weight_log_likelihood(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    eps_low: Optional[float],
    eps_high: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """CISPO per-token loss (MiniMax-M1 eqs. 4-5): a clipped, stop-gradient IS weight times
    the log-likelihood.

    ``logp``, ``old_logp``: ``[N, T]``; ``advantages``: ``[N]`` or ``[N, T]``. With
    ``r = exp(logp - old_logp)``::

        w    = clip(r, 1 - eps_low, 1 + eps_high)     (no lower bound when eps_low is None)
        loss = -sg(w) * A * logp

    ``d loss / d logp = -w * A`` on every token, clipped or not (``-A`` at ``r = 1``). Returns
    ``(loss, clipped_low, clipped_high)``, all ``[N, T]``, the flags ``r < 1 - eps_low`` and
    ``r > 1 + eps_high`` (the weight was truncated, whatever the sign of ``A``).
    """
    _check_clip(0.0 if eps_low is None else eps_low, eps_high)
    if advantages.dim() == logp.dim() - 1:
        advantages = advantages.unsqueeze(-1)
    ratio = torch.exp(logp - old_logp).detach()
    low = None if eps_low is None else 1.0 - eps_low
    weight = ratio.clamp(min=low, max=1.0 + eps_high)
    loss = -weight * advantages * logp
    clipped_low = ratio < low if low is not None else torch.zeros_like(ratio, dtype=torch.bool)
    return loss, clipped_low, ratio > 1.0 + eps_high


def soft_gated_surrogate(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, tau_pos: float, tau_neg: float
) -> Tensor:
    """SAPO per-token loss: a sigmoid soft gate on the ratio instead of a hard clip.

    ``logp``, ``old_logp``: ``[N, T]``; ``advantages``: ``[N]`` or ``[N, T]``. With
    ``r = exp(logp - old_logp)``::

        tau  = tau_pos if A > 0 else tau_neg
        loss = -(4 / tau) * sigmoid(tau * (r - 1)) * A

    ``d loss / d logp = -4 s (1 - s) r A``, ``s = sigmoid(tau (r - 1))``: ``-A`` at ``r = 1``.
    """
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"temperatures must be positive, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    if advantages.dim() == logp.dim() - 1:
        advantages = advantages.unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    return -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * advantages


def geometric_mean_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """GMPO sequence loss: the geometric mean of token ratios, each clipped in log space.

    ``logp``, ``old_logp``, ``mask``: ``[N, T]``; ``advantages``: ``[N]``. With
    ``d_t = logp_t - old_logp_t`` and ``sgn = sign(A_i)``::

        d'_t   = sgn * min(sgn * d_t, sgn * clip(d_t, -eps_low, eps_high))
        s_i    = exp( sum_t mask_t * d'_t / max(|o_i|, 1) )
        loss_i = -A_i * s_i

    ``loss_i`` is broadcast to every token of row ``i`` (``[N, T]``), so
    :func:`sequence_mean_token_mean` gives the mean of ``loss_i`` over completions. Returns
    ``(loss, clipped_low, clipped_high)``, the flags ``(d < -eps_low) & (A < 0)`` and
    ``(d > eps_high) & (A > 0)`` per token. An empty row has ``s_i = 1``.
    """
    _check_clip(eps_low, eps_high)
    n = logp.shape[0]
    if advantages.numel() != n:
        raise ValueError(
            f"geometric_mean_surrogate: advantages must have one value per row ({n}), "
            f"got shape {tuple(advantages.shape)}"
        )
    advantages = advantages.reshape(n, 1)
    sign = torch.sign(advantages)
    delta = logp - old_logp
    clipped = sign * torch.minimum(sign * delta, sign * delta.clamp(min=-eps_low, max=eps_high))
    seq_ratio = torch.exp(masked_mean(clipped, mask, dim=-1)).unsqueeze(-1)
    loss = (-advantages * seq_ratio).expand(logp.shape).contiguous()
    return loss, (delta < -eps_low) & (advantages < 0), (delta > eps_high) & (advantages > 0)
