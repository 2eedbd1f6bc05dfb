"""Pure tensor functions shared by the GRPO-family objectives (the policy losses are
:mod:`grpo_lightning.algorithms.policy_losses`).

Shape conventions used throughout:

* ``P`` prompts, ``G`` completions per prompt, ``N`` completions in total (rows),
* ``T`` padded completion length,
* ``mask``: float or bool tensor ``[N, T]``, 1 (``True``) on real completion tokens.

Every function works for any floating dtype and device, is differentiable where a
gradient makes sense, and never returns NaN for a row whose mask is all zeros.
Half-precision inputs are reduced in float32 and the result is cast back to the
input dtype.

References:

* PPO: Schulman et al. 2017, "Proximal Policy Optimization Algorithms".
* GRPO: Shao et al. 2024, "DeepSeekMath".
* Dr. GRPO: Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective".
* DAPO: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale".
* RLOO: Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization
  for Learning from Human Feedback in LLMs".
* GSPO: Zheng et al. 2025, "Group Sequence Policy Optimization"; REINFORCE++: Hu et al. 2025.
* KL estimators: Schulman 2020, "Approximating KL Divergence".
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple, Union

import torch
from torch import Tensor

__all__ = [
    "KL_ESTIMATORS",
    "group_normalized_advantages",
    "group_centered_advantages",
    "leave_one_out_advantages",
    "batch_normalized_advantages",
    "informative_groups",
    "overlong_penalty",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_estimate",
    "masked_sum",
    "masked_mean",
    "token_mean",
    "sequence_mean_token_mean",
    "sequence_mean_token_sum",
    "constant_normalized_sum",
    "left_padding_last",
    "position_ids_from_mask",
]

KL_ESTIMATORS: Tuple[str, ...] = ("k1", "k2", "k3")
#: Divisors of :func:`group_normalized_advantages` (TRL's ``scale_rewards`` values).
REWARD_SCALES: Tuple[str, ...] = ("group", "batch", "none")

Count = Union[int, float, Tensor]
Dim = Union[int, Tuple[int, ...], None]


# --------------------------------------------------------------------------- helpers


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype used for reductions: float64 stays float64, everything else uses float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _as_float(x: Tensor) -> Tensor:
    """Return ``x`` unchanged if floating point, else cast to the default float dtype."""
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


def _apply_mask(x: Tensor, mask: Tensor) -> Tensor:
    """``x * mask`` with masked-out positions set to exactly 0 (even where ``x`` is inf/NaN)."""
    m = mask.to(x.dtype)
    return torch.where(mask != 0, x * m, torch.zeros((), dtype=x.dtype, device=x.device))


def _denominator(count: Count, like: Tensor) -> Tensor:
    """A count as a tensor on ``like``'s device in the reduction dtype, clamped to >= 1."""
    count = torch.as_tensor(count, device=like.device)
    return count.to(_acc_dtype(like.dtype)).clamp(min=1)


def _check_groups(rewards: Tensor, name: str, min_group: int) -> Tensor:
    if rewards.dim() != 2:
        raise ValueError(f"{name}: rewards must be 2-D [P, G], got shape {tuple(rewards.shape)}")
    if rewards.shape[1] < min_group:
        raise ValueError(
            f"{name}: needs at least {min_group} completions per prompt (G >= {min_group}), "
            f"got G={rewards.shape[1]}"
        )
    return _as_float(rewards)


def masked_sum(x: Tensor, mask: Tensor, dim: Dim = None) -> Tensor:
    """Sum of ``x * mask`` over ``dim`` (all dims if ``None``).

    ``x`` and ``mask`` broadcast together (typically both ``[N, T]``). Masked-out
    positions contribute exactly 0 even if ``x`` holds inf/NaN there. Returns
    ``x.dtype``.
    """
    masked = _apply_mask(x, mask)
    if dim is None:
        total = masked.sum(dtype=_acc_dtype(x.dtype))
    else:
        total = masked.sum(dim=dim, dtype=_acc_dtype(x.dtype))
    return total.to(x.dtype)


def masked_mean(x: Tensor, mask: Tensor, dim: Dim = None) -> Tensor:
    """Mean of ``x`` over masked elements: ``sum(x * mask) / max(sum(mask), 1)``.

    Reduces over ``dim`` (all dims if ``None``). An all-zero mask gives 0, not NaN.
    Returns ``x.dtype``.
    """
    acc = _acc_dtype(x.dtype)
    m = torch.broadcast_to(mask, torch.broadcast_shapes(x.shape, mask.shape)).to(acc)
    count = m.sum() if dim is None else m.sum(dim=dim)
    total = masked_sum(x, mask, dim).to(acc)
    return (total / count.clamp(min=1)).to(x.dtype)


def mean_abs_advantage(advantages: Tensor, completion_mask: Tensor) -> Tensor:
    """``mean |A|``: over completions for ``[N]`` advantages, over the completions' tokens (not the
    padding) for per-token ``[N, T]`` ones."""
    if advantages.dim() == 1:
        return advantages.abs().mean()
    return masked_mean(advantages.abs(), completion_mask)


# --------------------------------------------------------------- advantage estimators


def group_normalized_advantages(rewards: Tensor, eps: float = 1e-4, scale: str = "group") -> Tensor:
    """GRPO outcome-supervision advantages (DeepSeekMath, Sec. 4.1.2).

    ``rewards`` ``[P, G]`` -> ``[P, G]``::

        A_{p,i} = (r_{p,i} - mean_g(r_p)) / (std_g(r_p) + eps)

    with the unbiased (``G - 1``) standard deviation over each group. ``scale`` (one of
    :data:`REWARD_SCALES`) picks the divisor: ``"group"`` as above; ``"batch"`` the unbiased std of
    all ``P x G`` rewards (as TRL's ``scale_rewards="batch"``); ``"none"`` no division (Dr. GRPO's
    centring). Members of a group whose rewards are all equal get exactly 0. Raises ``ValueError``
    for ``G < 2`` (the unbiased std is undefined) and an unknown ``scale``.
    """
    rewards = _check_groups(rewards, "group_normalized_advantages", min_group=2)
    if scale not in REWARD_SCALES:
        raise ValueError(f"scale must be one of {REWARD_SCALES}, got {scale!r}")
    if rewards.numel() == 0:
        return torch.zeros_like(rewards)
    adv = rewards - rewards.mean(dim=1, keepdim=True)
    if scale == "group":
        adv = adv / (rewards.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        adv = adv / (rewards.std() + eps) if rewards.numel() > 1 else adv
    return torch.where(informative_groups(rewards).unsqueeze(1), adv, torch.zeros_like(adv))


def group_normalized_reward_sum(per_function: Tensor, weights: Tensor, group_size: int, eps: float = 1e-4) -> Tensor:
    """Normalise each reward function's scores within each group, then take the weighted sum (GDPO:
    decoupled group normalisation of several rewards, so that one with a wide range does not drown
    the others).

    ``per_function`` ``[N, F]`` (rows grouped by ``group_size``), ``weights`` ``[F]`` -> ``[N]``::

        z_{i,f} = (r_{i,f} - mean_g(r_f)) / (std_g(r_f) + eps),   R_i = sum_f w_f z_{i,f}

    NaN scores ("not applicable") are left out of their group's mean and std and of the sum; a
    function whose scores are equal within a group contributes 0 there.
    """
    n, functions = per_function.shape
    scores = per_function.reshape(n // group_size, group_size, functions)
    valid = ~torch.isnan(scores)
    count = valid.sum(dim=1, keepdim=True)
    filled = torch.where(valid, scores, torch.zeros_like(scores))
    mean = filled.sum(dim=1, keepdim=True) / count.clamp(min=1)
    centred = torch.where(valid, scores - mean, torch.zeros_like(scores))
    std = (centred.square().sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
    z = torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))
    z = torch.where(valid, z, torch.full_like(z, float("nan"))).reshape(n, functions)
    return torch.nansum(z * weights.to(device=z.device, dtype=z.dtype), dim=1)


def group_centered_advantages(rewards: Tensor) -> Tensor:
    """Dr. GRPO advantages: group mean baseline, no std scaling.

    ``rewards`` ``[P, G]`` -> ``[P, G]``::

        A_{p,i} = r_{p,i} - mean_g(r_p)

    Members of a group whose rewards are all equal get exactly 0.
    """
    rewards = _check_groups(rewards, "group_centered_advantages", min_group=1)
    adv = rewards - rewards.mean(dim=1, keepdim=True)
    return torch.where(informative_groups(rewards).unsqueeze(1), adv, torch.zeros_like(adv))


def leave_one_out_advantages(rewards: Tensor) -> Tensor:
    """RLOO advantages: each sample's baseline is the mean of the other ``G - 1``.

    ``rewards`` ``[P, G]`` -> ``[P, G]``::

        A_{p,i} = r_{p,i} - 1/(G-1) * sum_{j != i} r_{p,j} = G/(G-1) * (r_{p,i} - mean_g(r_p))

    Members of a group whose rewards are all equal get exactly 0. Raises
    ``ValueError`` for ``G < 2``.
    """
    rewards = _check_groups(rewards, "leave_one_out_advantages", min_group=2)
    g = rewards.shape[1]
    baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (g - 1)
    adv = rewards - baseline
    return torch.where(informative_groups(rewards).unsqueeze(1), adv, torch.zeros_like(adv))


def batch_normalized_advantages(rewards: Tensor) -> Tensor:
    """REINFORCE++-baseline advantages: group-mean baseline, then one scale for the whole batch.

    ``rewards`` ``[P, G]`` -> ``[P, G]``::

        A'_{p,i} = r_{p,i} - mean_g(r_p)
        A_{p,i}  = (A'_{p,i} - mean_batch(A')) / std_batch(A')

    ``mean_batch(A')`` is 0 (each group's centred rewards sum to 0) and is not subtracted, so equal
    groups keep exactly 0. ``std_batch``: unbiased, over all ``P * G`` entries; where it is 0 (or
    there are fewer than 2 entries) every advantage is 0.
    """
    centred = group_centered_advantages(rewards)
    if centred.numel() < 2:
        return torch.zeros_like(centred)
    std = centred.std()
    return centred / torch.where(std > 0, std, torch.ones_like(std))


def informative_groups(rewards: Tensor) -> Tensor:
    """DAPO dynamic-sampling filter: ``[P, G]`` -> bool ``[P]``.

    ``True`` where a group's rewards are not all equal, i.e. where group-relative
    advantages can be non-zero (DAPO keeps only these groups).
    """
    if rewards.dim() != 2:
        raise ValueError(
            f"informative_groups: rewards must be 2-D [P, G], got shape {tuple(rewards.shape)}"
        )
    if rewards.shape[1] == 0:
        return torch.zeros(rewards.shape[0], dtype=torch.bool, device=rewards.device)
    return (rewards != rewards[:, :1]).any(dim=1)


def overlong_penalty(
    lengths: Tensor,
    max_new_tokens: int,
    buffer: int,
    penalty_factor: float = 1.0,
) -> Tensor:
    """DAPO soft overlong punishment (DAPO eq. 13), added to the task reward.

    ``lengths`` ``[N]`` (completion lengths) -> float ``[N]``. With
    ``L = max_new_tokens`` and ``B = buffer``::

        R(len) = 0                                  if len <= L - B
               = -(len - (L - B)) / B * factor      if L - B < len <= L
               = -factor                            if len > L  (clamped)

    ``buffer`` must lie in ``(0, L]``. Integer lengths give the default float dtype;
    floating lengths keep their dtype.
    """
    if not 0 < buffer <= max_new_tokens:
        raise ValueError(
            "overlong_penalty: buffer must be in (0, max_new_tokens]: "
            f"got buffer={buffer}, max_new_tokens={max_new_tokens}"
        )
    lengths = _as_float(torch.as_tensor(lengths))
    start = max_new_tokens - buffer
    frac = ((lengths - start) / buffer).clamp(min=0.0, max=1.0)
    return -frac * penalty_factor


# ---------------------------------------------------------------- token selection


def top_entropy_mask(entropy: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """The tokens that train under "Beyond the 80/20 rule" (Wang et al. 2025, arXiv 2506.01939):
    those of ``mask`` whose entropy is at least the ``1 - quantile`` quantile of the entropies of
    ``mask``'s tokens (linear interpolation, as ``torch.quantile``). ``quantile = 1`` keeps every
    token of ``mask``. ``[N, T]`` -> ``[N, T]`` in ``mask``'s dtype.
    """
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile must be in (0, 1], got {quantile}")
    selected = mask.bool()
    if quantile == 1.0 or not selected.any():
        return mask
    threshold = torch.quantile(entropy.detach()[selected].float(), 1.0 - quantile)
    return (selected & (entropy.detach() >= threshold)).to(mask.dtype)



# ------------------------------------------------------------------------ KL penalty


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 estimator of KL(pi || pi_ref) per token (Schulman 2020): ``logp - ref_logp``.

    ``[N, T]`` -> ``[N, T]``. Unbiased, high variance, can be negative.
    """
    return logp - ref_logp


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 estimator of KL(pi || pi_ref) per token (Schulman 2020):
    ``0.5 * (logp - ref_logp) ** 2``.

    ``[N, T]`` -> ``[N, T]``. Biased, low variance, always >= 0.
    """
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator of KL(pi || pi_ref) per token (Schulman 2020; DeepSeekMath eq. 4).

    ``[N, T]`` -> ``[N, T]``. With ``d = ref_logp - logp``::

        k3 = exp(d) - d - 1

    Unbiased and always >= 0 (computed as ``expm1(d) - d`` for accuracy near 0).
    """
    d = ref_logp - logp
    return (torch.expm1(d) - d).clamp(min=0.0)


_KL_FUNCTIONS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
}


def kl_estimate(logp: Tensor, ref_logp: Tensor, estimator: str) -> Tensor:
    """Per-token KL(pi || pi_ref) with the named estimator (one of :data:`KL_ESTIMATORS`).

    ``[N, T]`` -> ``[N, T]``. Raises ``ValueError`` for an unknown name.
    """
    try:
        fn = _KL_FUNCTIONS[estimator]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown KL estimator {estimator!r}; valid choices are {', '.join(KL_ESTIMATORS)}"
        ) from None
    return fn(logp, ref_logp)


# ----------------------------------------------------------------- loss aggregations
#
# Each aggregation takes optional batch-wide counts. Passing the whole batch's
# counts to every micro-batch makes the sum of the micro-batch results equal the
# whole-batch result (values and gradients).


def token_mean(loss: Tensor, mask: Tensor, *, num_tokens: Optional[Count] = None) -> Tensor:
    """Token-level mean over the batch (DAPO eq. 12).

    ``loss``, ``mask``: ``[N, T]`` -> scalar::

        sum_{i,t} (loss * mask)_{i,t} / num_tokens

    ``num_tokens`` defaults to ``sum(mask)``; it is clamped to >= 1.
    """
    if num_tokens is None:
        num_tokens = mask.to(_acc_dtype(loss.dtype)).sum()
    total = masked_sum(loss, mask).to(_acc_dtype(loss.dtype))
    return (total / _denominator(num_tokens, loss)).to(loss.dtype)


def sequence_mean_token_mean(
    loss: Tensor, mask: Tensor, *, num_sequences: Optional[Count] = None
) -> Tensor:
    """Mean over sequences of each sequence's token mean (DeepSeekMath eq. 3; GSPO).

    ``loss``, ``mask``: ``[N, T]`` -> scalar::

        sum_i [ sum_t (loss * mask)_{i,t} / max(|y_i|, 1) ] / num_sequences

    with ``|y_i| = sum_t mask_{i,t}``. ``num_sequences`` defaults to ``N``; it is
    clamped to >= 1.
    """
    if num_sequences is None:
        num_sequences = loss.shape[0]
    per_sequence = masked_mean(loss, mask, dim=-1).to(_acc_dtype(loss.dtype))
    return (per_sequence.sum() / _denominator(num_sequences, loss)).to(loss.dtype)


def sequence_mean_token_sum(
    loss: Tensor, mask: Tensor, *, num_sequences: Optional[Count] = None
) -> Tensor:
    """Mean over sequences of each sequence's token sum (RLOO: a completion is one action).

    ``loss``, ``mask``: ``[N, T]`` -> scalar::

        sum_{i,t} (loss * mask)_{i,t} / num_sequences

    ``num_sequences`` defaults to ``N``; it is clamped to >= 1.
    """
    if num_sequences is None:
        num_sequences = loss.shape[0]
    total = masked_sum(loss, mask).to(_acc_dtype(loss.dtype))
    return (total / _denominator(num_sequences, loss)).to(loss.dtype)


def constant_normalized_sum(
    loss: Tensor,
    mask: Tensor,
    max_tokens: int,
    *,
    num_sequences: Optional[Count] = None,
) -> Tensor:
    """Token sum over a constant normaliser (Dr. GRPO; removes the length bias).

    ``loss``, ``mask``: ``[N, T]`` -> scalar::

        sum_{i,t} (loss * mask)_{i,t} / (num_sequences * max_tokens)

    ``max_tokens`` (e.g. the generation budget) must be positive. ``num_sequences``
    defaults to ``N``; it is clamped to >= 1.
    """
    if max_tokens <= 0:
        raise ValueError(f"constant_normalized_sum: max_tokens must be positive, got {max_tokens}")
    if num_sequences is None:
        num_sequences = loss.shape[0]
    total = masked_sum(loss, mask).to(_acc_dtype(loss.dtype))
    denom = _denominator(num_sequences, loss) * max_tokens
    return (total / denom).to(loss.dtype)


def left_padding_last(attention_mask: Tensor, most: int | None = None) -> tuple[Tensor, Tensor]:
    """The column order that moves each row's left padding to its end, and each row's shift.

    A position of left padding attends to no key at all (every key up to it is padding), and for
    such rows some fused attention kernels give NaN gradients to the whole batch, though nothing
    there is scored (cuDNN's backward at widths of 64 mod 128 on H100/H200, torch 2.11-2.13:
    pytorch/pytorch#196678, ``benchmarks/JOURNAL.md``). In the new
    order every position sees its row's first real token; the tokens keep their order and, through
    :func:`position_ids_from_mask`, their positions.

    ``attention_mask``: ``[N, L]`` -> ``(order, shift)``: ``x.gather(1, order)`` reorders a ``[N, L]``
    tensor; ``shift`` ``[N]`` counts each row's leading padding, at most ``most``, so column ``c``
    moves to ``c - shift`` (a prompt of ``S`` columns gives ``most = S - 1``: its last column, even
    if it is padding, still predicts the first completion token).
    """
    width = attention_mask.size(1)
    shift = (attention_mask.long().cumsum(-1) == 0).sum(-1)
    if most is not None:
        shift = shift.clamp(max=most)
    order = (torch.arange(width, device=attention_mask.device) + shift[:, None]) % width
    return order, shift


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding, as ``generate`` assigns them: ``cumsum(mask) - 1``.

    ``attention_mask``: ``[N, S]``, 1 on real tokens -> ``[N, S]`` int64, 0 on the padding.
    """
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.clamp(min=0)
