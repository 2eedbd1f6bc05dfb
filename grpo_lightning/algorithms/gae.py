"""Pure tensor math of PPO with a learned critic: per-token rewards, GAE, whitening, the clipped
value loss and the explained variance.

Shapes: ``N`` completions (rows), ``T`` padded completion length; ``mask`` ``[N, T]`` is 1 on a
completion's tokens, ones then zeros along each row (a zero ends the row's trajectory). Token
``t`` of a row is the action taken in state ``s_t`` (the prompt and the tokens before ``t``); its
value ``V_t = V(s_t)``. A completion ends its episode: the state after its last token is terminal
(value 0), also for a completion cut at ``max_new_tokens``.

References: Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation" (eqs. 11-16); Schulman et al. 2017, "Proximal Policy Optimization Algorithms"; Ouyang
et al. 2022, "Training language models to follow instructions with human feedback" (eq. 2: the
per-token KL penalty in the reward).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from grpo_lightning.algorithms.functional import masked_mean

__all__ = ["clipped_value_loss", "explained_variance", "gae", "token_rewards", "whiten"]


def _check_same_shape(name: str, **tensors: Tensor) -> None:
    shapes = {key: tuple(value.shape) for key, value in tensors.items()}
    if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 2:
        raise ValueError(f"{name}: {', '.join(shapes)} must all be [N, T], got {shapes}")


def token_rewards(scores: Tensor, kl: Tensor | None, mask: Tensor, beta: float) -> Tensor:
    """Per-token rewards ``[N, T]``: the KL penalty at every token, the task reward at the last::

        r_t = -beta * kl_t + 1[t = last token of the row] * score

    ``scores`` ``[N]``; ``kl`` ``[N, T]`` (e.g. k1 ``log pi_old - log pi_ref``) or ``None`` for no
    penalty. 0 outside ``mask``; a row without tokens drops its score.
    """
    mask = mask.to(scores.dtype if scores.is_floating_point() else torch.float32)
    rewards = torch.zeros_like(mask) if kl is None else -beta * kl.to(mask.dtype) * mask
    positions = torch.arange(mask.size(1), device=mask.device).expand_as(mask)
    last = torch.where(mask != 0, positions, torch.full_like(positions, -1)).amax(dim=1)
    score = torch.where(last >= 0, scores.to(mask.dtype), torch.zeros_like(scores, dtype=mask.dtype))
    return rewards.scatter_add(1, last.clamp(min=0).unsqueeze(1), score.unsqueeze(1))


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 0.95) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over each row of a masked batch; ``(advantages, returns)``, ``[N, T]``::

        delta_t = r_t + gamma * V_{t+1} - V_t        (V_{t+1} = 0 after the row's last token)
        A_t     = delta_t + gamma * lam * A_{t+1}    (A_{t+1} = 0 after the row's last token)
        R_t     = A_t + V_t                          (the critic's target: the lambda-return)

    Both are 0 outside ``mask``; whatever ``values`` holds there is ignored. Computed in float32
    (float64 stays float64), backwards over ``T`` with no gradient.
    """
    _check_same_shape("gae", rewards=rewards, values=values, mask=mask)
    dtype = torch.float64 if rewards.dtype == torch.float64 else torch.float32
    valid = mask != 0
    rewards, values = rewards.detach().to(dtype) * valid, values.detach().to(dtype) * valid
    advantages = torch.zeros_like(rewards)
    next_value = next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantages[:, t] = (delta + gamma * lam * next_advantage) * valid[:, t]
        next_value, next_advantage = values[:, t], advantages[:, t]
    return advantages, (advantages + values) * valid


def whiten(x: Tensor, mask: Tensor, eps: float = 1e-8, total: Callable[[Tensor], Tensor] = lambda t: t) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` with the mean and the (biased) variance over the masked
    entries of the whole batch; 0 outside ``mask``. ``total`` sums a tensor over the processes
    whose batches make the whole batch (the identity: this process's batch alone)."""
    mask = mask.to(x.dtype)
    count = total(mask.sum())
    mean = total((x * mask).sum()) / count
    var = total(((x - mean).square() * mask).sum()) / count
    return torch.where(mask != 0, (x - mean) * torch.rsqrt(var + eps), torch.zeros_like(x))


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, clip: float | None
) -> tuple[Tensor, Tensor]:
    """PPO's clipped value loss per token (neither masked nor aggregated), and where the clip binds::

        V_clip = V_old + clip(V - V_old, -clip, clip)
        loss   = 1/2 * max((V - R)^2, (V_clip - R)^2)

    ``clip`` ``None``: ``1/2 (V - R)^2``. The clip binds (``clipped``) where the clipped term is the
    larger: ``V`` then lies outside ``V_old +- clip`` and the token's gradient is 0.
    """
    _check_same_shape("clipped_value_loss", values=values, old_values=old_values, returns=returns)
    unclipped = (values - returns).square()
    if clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    if clip <= 0:
        raise ValueError(f"clipped_value_loss: clip must be positive or None, got {clip}")
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    clipped_term = (clipped_values - returns).square()
    return 0.5 * torch.maximum(unclipped, clipped_term), clipped_term > unclipped


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """``1 - Var[R - V] / Var[R]`` over the masked entries: 1 is a perfect critic, 0 one no better
    than the mean return, below 0 worse. NaN where the returns do not vary (nothing to explain)."""
    _check_same_shape("explained_variance", values=values, returns=returns, mask=mask)
    values, returns = values.detach().float(), returns.detach().float()
    var_returns = masked_mean((returns - masked_mean(returns, mask)).square(), mask)
    residual = returns - values
    var_residual = masked_mean((residual - masked_mean(residual, mask)).square(), mask)
    return torch.where(var_returns > 0, 1 - var_residual / var_returns, torch.full_like(var_returns, float("nan")))
