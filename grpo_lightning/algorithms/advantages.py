"""Advantage estimators of one completion each: ``rewards`` ``[P, G]`` (``P`` prompts, ``G``
completions per prompt) -> advantages ``[P, G]``. The math is :mod:`grpo_lightning.algorithms.functional`'s;
here each gets the name it is selected by (``--model.advantage NAME``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from grpo_lightning.algorithms import functional as F


def group_std(rewards: Tensor) -> Tensor:
    """GRPO (DeepSeekMath eq. 3): ``A_pi = (r_pi - mean_g r_p) / (std_g r_p + 1e-4)``, unbiased std;
    0 for a group of equal rewards. ``[P, G]`` -> ``[P, G]``, ``G >= 2``."""
    return F.group_normalized_advantages(rewards, scale="group")


def group_mean(rewards: Tensor) -> Tensor:
    """Dr. GRPO: ``A_pi = r_pi - mean_g r_p`` (no division by a std). ``[P, G]`` -> ``[P, G]``."""
    return F.group_centered_advantages(rewards)


def leave_one_out(rewards: Tensor) -> Tensor:
    """RLOO: ``A_pi = r_pi - 1/(G-1) sum_{j != i} r_pj``. ``[P, G]`` -> ``[P, G]``, ``G >= 2``."""
    return F.leave_one_out_advantages(rewards)


def batch_std(rewards: Tensor) -> Tensor:
    """REINFORCE++ with baseline: ``A'_pi = r_pi - mean_g r_p``, ``A_pi = A'_pi / std_batch(A')``
    (unbiased, over all ``P * G``; 0 everywhere when that std is 0). ``[P, G]`` -> ``[P, G]``."""
    return F.batch_normalized_advantages(rewards)


def gpg(rewards: Tensor) -> Tensor:
    """GPG (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning", arXiv 2504.02546), in verl's form: ``A_pi = alpha (r_pi - mean_g r_p) / F_norm``,
    ``F_norm = 1``, ``alpha = P G / #{r != 0}`` (the batch's completions over those rewarded, 1 when
    none is): the gradient the zero-advantage groups leave out is made up. On each device, its
    share of the batch. ``[P, G]`` -> ``[P, G]``."""
    alpha = rewards.numel() / max(int(torch.count_nonzero(rewards)), 1)
    return alpha * F.group_centered_advantages(rewards)


def max_rl(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """MaxRL ("Maximum Likelihood Reinforcement Learning"; prime-rl's ``max_rl``):
    ``A_pi = (r_pi - mean_g r_p) / (mean_g r_p + eps)``, the centred reward over the group's success
    rate instead of its std: with 0/1 rewards the gradient of ``log p(success)``, so hard prompts
    (low success rate) weigh more. 0 for a group of equal rewards. Rewards must not be negative:
    a group with differing rewards and a mean <= 0 is a ``ValueError``. ``[P, G]`` -> ``[P, G]``."""
    mean, centred = rewards.mean(dim=1, keepdim=True), F.group_centered_advantages(rewards)
    if bool(((mean <= 0) & (centred != 0).any(dim=1, keepdim=True)).any()):
        raise ValueError(
            "max_rl: a group's rewards differ with a mean <= 0; MaxRL divides by the mean as a success rate and "
            "needs rewards >= 0 (drop negative reward terms, e.g. overlong shaping, or pick another advantage)."
        )
    return torch.where(mean > 0, centred / (mean + eps), torch.zeros_like(centred))


#: Name -> estimator ``rewards [P, G] -> advantages [P, G]``.
ADVANTAGES: dict[str, Callable[[Tensor], Tensor]] = {
    "group_std": group_std,
    "group_mean": group_mean,
    "leave_one_out": leave_one_out,
    "batch_std": batch_std,
    "gpg": gpg,
    "max_rl": max_rl,
}
