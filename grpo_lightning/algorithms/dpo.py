"""Pure tensor math of a DPO term on sampled groups: which completions form a pair, and the pair loss.

DPO: Rafailov et al. 2023, "Direct Preference Optimization: Your Language Model is Secretly a
Reward Model", eq. 7, on pairs drawn from the policy's own samples as in Guo et al. 2024, "Direct
Language Model Alignment from Online AI Feedback". Imports only torch, like ``functional.py``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def best_worst_pairs(rewards: Tensor) -> tuple[Tensor, Tensor]:
    """One pair per group: its best completion (the winner ``y_w``) and its worst (the loser ``y_l``).

    ``rewards`` ``[P, G]`` -> ``(winners [K], losers [K])``: row indices ``g * G + i`` of the flat
    rollout, ``K <= P``, in group order. A tie for best or for worst goes to the first completion of
    the group holding that reward. A group whose best reward equals its worst (all equal, or
    ``G = 1``) has no preference and forms no pair; nor does a group with a NaN reward.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [P, G], got shape {tuple(rewards.shape)}")
    num_groups, group_size = rewards.shape
    best, worst = rewards.amax(dim=1, keepdim=True), rewards.amin(dim=1, keepdim=True)
    position = torch.arange(group_size, device=rewards.device).expand(num_groups, group_size)
    first_best = torch.where(rewards == best, position, group_size).amin(dim=1)
    first_worst = torch.where(rewards == worst, position, group_size).amin(dim=1)
    groups = (best > worst).flatten().nonzero().flatten()  # False for NaN: no preference
    start = groups * group_size
    return start + first_best[groups], start + first_worst[groups]


def pairs_led_by(rows: Tensor, winners: Tensor, losers: Tensor) -> tuple[Tensor, Tensor]:
    """The pairs whose winner is among ``rows`` (a minibatch's), wherever their loser is.

    Every pair then belongs to exactly one minibatch, whatever the split of the rollout.
    """
    keep = torch.isin(winners, rows.to(winners.device))
    return winners[keep], losers[keep]


def dpo_pair_loss(
    policy_winner: Tensor, ref_winner: Tensor, policy_loser: Tensor, ref_loser: Tensor, beta: float
) -> tuple[Tensor, Tensor]:
    """DPO loss of each pair (Rafailov et al. 2023, eq. 7) and its implicit reward margin.

    Sequence log-probs ``[K]`` (the sum of each completion's token log-probs) under the policy and
    the frozen reference -> ``(loss [K], margin [K])``::

        margin = beta * ((log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l)))
        loss   = -log sigmoid(margin)

    ``margin`` is the difference of DPO's implicit rewards ``beta * log(pi / pi_ref)``: positive
    when the policy already prefers the winner more than the reference does.
    """
    margin = beta * ((policy_winner - ref_winner) - (policy_loser - ref_loser))
    return -torch.nn.functional.logsigmoid(margin), margin
