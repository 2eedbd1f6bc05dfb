"""Specification of RLOO (Ahmadian et al. 2024, *Back to Basics*): its paper defaults, the
leave-one-out baseline and the KL in the reward, by hand."""

from __future__ import annotations

import math

import torch
from torch.testing import assert_close

from grpo_lightning.variants import RLOO
from tests.helpers import (
    LOSS,
    MASK,
    REWARDS,
    assert_clip_higher_boundary,
    assert_constructs_without_loading,
    hand_rollout,
    t,
)


# ------------------------------------------------------------------ construction and defaults


def test_construction_loads_nothing_and_is_instant(monkeypatch):
    assert_constructs_without_loading(RLOO, monkeypatch)


def test_defaults_follow_the_papers():
    module = RLOO(model="unused")  # RLOO: KL penalty in the reward
    assert module.coefficients.beta == 0.05
    assert (module.settings.clip_eps_low, module.settings.clip_eps_high) == (0.2, 0.2)
    assert module.settings.kl_estimator == "k1"  # RLOO: k1 in the reward, as the paper
    assert module.settings.kl_placement == "reward"


# ------------------------------------------------------------------ hand-computed hook values

# REWARDS, LOSS and MASK, and their hand-worked values, are in tests/helpers.py.


def test_advantages_by_hand():
    # Leave-one-out: 3 - (1+2+2)/3 = 4/3; 1 - (3+2+2)/3 = -4/3; 2 - (3+1+2)/3 = 0.
    advantages = RLOO(model="unused").advantages(t(REWARDS))
    assert_close(advantages, t([[4 / 3, -4 / 3, 0.0, 0.0], [0.0] * 4]))
    assert torch.equal(advantages[1], torch.zeros(4, dtype=torch.float64))


def test_aggregate_on_a_ragged_mask_by_hand():
    module = RLOO(model="unused", sampling={"max_new_tokens": 4})
    assert_close(module.aggregate(t(LOSS), t(MASK)), t(5.5))  # sequence mean of token sums: (6 + 5) / 2


def test_token_loss_clip_higher_boundary():
    # eps_high 0.2: -min(1.25 * 1, 1.2 * 1) = -1.2, clipped: no gradient
    assert_clip_higher_boundary(RLOO(model="unused"), high_loss=-1.2, high_grad=0.0, high_clipped=0.5)


# ------------------------------------------------------------------ KL in the reward


def test_rloo_puts_the_summed_k1_kl_in_the_reward():
    rollout = hand_rollout([3, 2], width=3, group_size=2)
    rollout.old_logp = t([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    rollout.ref_logp = t([[-1.5, -1.0, -3.0], [-1.0, -1.0, 0.0]])
    # row 0: (0.5) + (-1) + 0 = -0.5; row 1: 0.5 + 0.5 (third token masked) = 1.0
    # beta 0.05: [1 + 0.025, 2 - 0.05]
    shaped = RLOO(model="unused").shape_rewards(t([1.0, 2.0]), rollout)
    assert_close(shaped, t([1.025, 1.95]))
    in_loss = RLOO(model="unused", kl={"placement": "loss"})
    assert_close(in_loss.shape_rewards(t([1.0, 2.0]), rollout), t([1.0, 2.0]))
    assert in_loss.settings.kl_estimator == "k3"  # in the loss, the base's default


def test_rloo_puts_the_chosen_kl_estimator_in_the_reward():
    rollout = hand_rollout([3, 2], width=3, group_size=2)
    rollout.old_logp = t([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    rollout.ref_logp = t([[-1.5, -1.0, -3.0], [-1.0, -1.0, 0.0]])
    # k3 = exp(d) - d - 1 with d = ref - old: row 0 d = -0.5, 1, 0; row 1 d = -0.5, -0.5 (third token masked)
    k3 = lambda d: math.exp(d) - d - 1  # noqa: E731
    row0, row1 = k3(-0.5) + k3(1.0) + k3(0.0), 2 * k3(-0.5)  # 0.824813, 0.213061
    shaped = RLOO(model="unused", kl={"estimator": "k3"}).shape_rewards(t([1.0, 2.0]), rollout)
    assert_close(shaped, t([1.0 - 0.05 * row0, 2.0 - 0.05 * row1]))
    # k2 = d^2 / 2: row 0 (0.25 + 1) / 2, row 1 (0.25 + 0.25) / 2
    shaped = RLOO(model="unused", kl={"estimator": "k2"}).shape_rewards(t([1.0, 2.0]), rollout)
    assert_close(shaped, t([1.0 - 0.05 * 0.625, 2.0 - 0.05 * 0.25]))
