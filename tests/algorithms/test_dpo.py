"""DPO's parts (``grpo_lightning.algorithms.dpo``, Rafailov et al. 2023, eq. 7) by hand: each group's
best and worst completion as a pair, the minibatch a pair belongs to, and the pair loss. The preset
that uses them is tests/variants/test_online_dpo_grpo.py."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from grpo_lightning.algorithms import dpo


def test_pairs_are_each_groups_best_and_worst_with_ties_to_the_first():
    rewards = torch.tensor([
        [0.0, 1.0, 1.0, 0.0],  # best 1 at 1 and 2 -> 1; worst 0 at 0 and 3 -> 0: rows (1, 0)
        [2.0, 2.0, 2.0, 2.0],  # equal rewards: no pair
        [0.5, 3.0, 0.5, 1.0],  # best at 1; worst 0.5 at 0 and 2 -> 0: rows (9, 8)
        [1.0, float("nan"), 0.0, 1.0],  # a NaN reward: no pair
        [-1.0, 0.0, 0.0, 2.0],  # best at 3, worst at 0: rows (19, 16)
    ])  # fmt: skip
    winners, losers = dpo.best_worst_pairs(rewards)
    assert winners.tolist() == [1, 9, 19] and losers.tolist() == [0, 8, 16]
    none = dpo.best_worst_pairs(torch.ones(3, 1))  # G = 1: nothing to compare
    assert none[0].numel() == none[1].numel() == 0
    with pytest.raises(ValueError, match="rewards must be \\[P, G\\]"):
        dpo.best_worst_pairs(torch.ones(8))


def test_a_pair_belongs_to_the_minibatch_holding_its_winner():
    winners, losers = torch.tensor([1, 9, 19]), torch.tensor([0, 8, 16])
    led = dpo.pairs_led_by(torch.tensor([16, 0, 9, 3]), winners, losers)  # holds only winner 9
    assert led[0].tolist() == [9] and led[1].tolist() == [8]


def test_pair_loss_by_hand():
    # Pair 0: policy and reference agree on both -> margin 0, loss -log sigmoid(0) = log 2.
    # Pair 1: 0.1 * ((-1 - -2) - (-3 - -1)) = 0.1 * (1 + 2) = 0.3 -> loss log(1 + e^-0.3).
    # Pair 2: 0.1 * ((-4 - -1) - (-2 - -2)) = -0.3 -> loss log(1 + e^0.3), a wrong preference.
    policy_w = torch.tensor([-5.0, -1.0, -4.0], requires_grad=True)
    loss, margin = dpo.dpo_pair_loss(
        policy_w, torch.tensor([-5.0, -2.0, -1.0]), torch.tensor([-7.0, -3.0, -2.0]), torch.tensor([-7.0, -1.0, -2.0]), 0.1
    )
    assert_close(margin, torch.tensor([0.0, 0.3, -0.3]))
    assert_close(loss, torch.tensor([math.log(2.0), math.log(1 + math.exp(-0.3)), math.log(1 + math.exp(0.3))]))
    # d loss / d log pi(y_w) = -beta * sigmoid(-margin): -0.05 at margin 0.
    (grad,) = torch.autograd.grad(loss.sum(), policy_w)
    sigmoid = [1 / (1 + math.exp(-m)) for m in (0.0, -0.3, 0.3)]
    assert_close(grad, torch.tensor([-0.1 * s for s in sigmoid]))
