"""Masks on the per-token loss that a run adds to any surrogate."""

from __future__ import annotations

from torch import Tensor

from grpo_lightning.algorithms import functional as F


def off_policy_sequence_mask(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """Off-policy sequence masking (OPSM; DeepSeek-V3.2, "DeepSeek-V3.2: Pushing the Frontier of Open
    Large Language Models"; TRL's ``off_policy_mask_threshold``). A completion with a
    negative advantage that the policy has drifted away from carries no loss::

        keep_i = A_i >= 0  or  1/|o_i| sum_t m_it (log pi_old,it - log pi_it) <= threshold

    Negative samples far off-policy are the ones most likely to destabilise training; on-policy
    (one optimizer step per rollout) the drift is 0 and nothing is masked. ``[N, T]`` (1 or 0 per row, no gradient);
    ``advantages`` ``[N]``, or per token ``[N, T]`` (its completion's mean decides)."""
    drift = F.masked_mean(old_logp - logp.detach(), mask, dim=-1)
    sequence_advantage = advantages if advantages.dim() == 1 else F.masked_mean(advantages, mask, dim=-1)
    keep = (sequence_advantage >= 0) | (drift <= threshold)
    return keep.to(logp.dtype).unsqueeze(-1).expand_as(logp)
