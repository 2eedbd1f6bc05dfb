"""Specification of REINFORCE++ (Hu et al. 2025), baseline form: its paper defaults, hand-computed
hook values, the batch-wide advantage normalisation, the PPO clip and the KL in the reward."""

from __future__ import annotations

import math

import torch
from torch.testing import assert_close

from grpo_lightning.variants import ReinforcePlusPlus
from tests.helpers import (
    LOSS,
    MASK,
    REWARDS,
    assert_aggregate_adds_up_over_halves,
    assert_constructs_without_loading,
    hand_rollout,
    t,
    token_grad,
)


# ------------------------------------------------------------------ construction and defaults


def test_construction_loads_nothing_and_is_instant(monkeypatch):
    assert_constructs_without_loading(ReinforcePlusPlus, monkeypatch)


def test_defaults_follow_the_papers():
    module = ReinforcePlusPlus(model="unused")  # PPO clip; k1 KL in the reward
    assert module.coefficients.beta == 0.01
    assert (module.settings.clip_eps_low, module.settings.clip_eps_high) == (0.2, 0.2)
    assert module.settings.kl_placement == "reward"
    assert module.hparams["loss"]["clip_eps_low"] == 0.2  # what checkpoints and the CLI record


# ------------------------------------------------------------------ hand-computed hook values

# REWARDS, LOSS and MASK, and their hand-worked values, are in tests/helpers.py.


def test_advantages_by_hand():
    # centred [1, -1, 0, 0 | 0, 0, 0, 0]; unbiased std over all 8: sqrt(2 / 7);
    # 1 / sqrt(2/7) = sqrt(3.5) = 1.8708286933869707.
    advantages = ReinforcePlusPlus(model="unused").advantages(t(REWARDS))
    assert_close(advantages, t([[1.8708286933869707, -1.8708286933869707, 0.0, 0.0], [0.0] * 4]))
    assert torch.equal(advantages[1], torch.zeros(4, dtype=torch.float64))


def test_aggregate_on_a_ragged_mask_by_hand():
    module = ReinforcePlusPlus(model="unused", sampling={"max_new_tokens": 4})
    assert_close(module.aggregate(t(LOSS), t(MASK)), t(2.75))  # token mean over the batch
    assert_aggregate_adds_up_over_halves(module)


# ------------------------------------------------------------------ batch-wide normalisation and the PPO clip


def test_reinforce_plus_plus_scales_by_the_batch_std_not_each_groups():
    # centred [0.5, -0.5 | 2, -2]; unbiased std over the batch: sqrt((0.25 + 0.25 + 4 + 4) / 3)
    # = sqrt(8.5 / 3) = 1.6832508230603465: 0.5 / it = 0.2970442628930023, 2 / it = 1.1881770515720091.
    # (Per-group scaling would give +-0.707 in both groups.)
    advantages = ReinforcePlusPlus(model="unused").advantages(t([[1.0, 0.0], [4.0, 0.0]]))
    assert_close(advantages, t([[0.2970442628930023, -0.2970442628930023], [1.1881770515720091, -1.1881770515720091]]))


def test_reinforce_plus_plus_all_equal_batch_is_all_zero():
    module = ReinforcePlusPlus(model="unused")
    for rewards in ([[1.0, 1.0], [2.0, 2.0]], [[3.0]]):  # std 0; a single entry (no unbiased std)
        advantages = module.advantages(t(rewards))
        assert torch.equal(advantages, torch.zeros_like(advantages))
        assert not advantages.isnan().any()


def test_reinforce_plus_plus_keeps_the_ppo_clip():
    # Row 0: r = 1.25, A = +1: -min(1.25, 1.2) = -1.2, clipped; row 1: r = 0.75, A = -1: 0.8, clipped.
    module = ReinforcePlusPlus(model="unused")
    logp = t([[math.log(1.25)], [math.log(0.75)]]).requires_grad_()
    loss = module.token_loss(logp, torch.zeros_like(logp), t([1.0, -1.0]), t([[1.0], [1.0]]))
    assert_close(loss.detach(), t([[-1.2], [0.8]]))
    assert torch.equal(token_grad(loss, logp), torch.zeros_like(logp))


# ------------------------------------------------------------------ KL in the reward


def test_reinforce_plus_plus_puts_the_summed_k1_kl_in_the_reward():
    rollout = hand_rollout([3, 2], width=3, group_size=2)
    rollout.old_logp = t([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    rollout.ref_logp = t([[-1.5, -1.0, -3.0], [-1.0, -1.0, 0.0]])
    # k1 = old - ref: row 0: 0.5 - 1 + 0 = -0.5; row 1: 0.5 + 0.5 (third token masked) = 1.0.
    # beta 0.01: [1 + 0.005, 2 - 0.01]
    assert_close(ReinforcePlusPlus(model="unused").shape_rewards(t([1.0, 2.0]), rollout), t([1.005, 1.99]))
    in_loss = ReinforcePlusPlus(model="unused", kl={"placement": "loss"})
    assert in_loss.settings.kl_placement == "loss"
    assert_close(in_loss.shape_rewards(t([1.0, 2.0]), rollout), t([1.0, 2.0]))
    assert in_loss.settings.kl_estimator == "k3"  # in the loss, the base's default


def test_reinforce_plus_plus_puts_the_chosen_kl_estimator_in_the_reward():
    rollout = hand_rollout([3, 2], width=3, group_size=2)
    rollout.old_logp = t([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    rollout.ref_logp = t([[-1.5, -1.0, -3.0], [-1.0, -1.0, 0.0]])
    # k2 = (ref - old)^2 / 2: row 0 (0.25 + 1 + 0) / 2 = 0.625; row 1 (0.25 + 0.25) / 2 = 0.25 (third token masked)
    shaped = ReinforcePlusPlus(model="unused", kl={"estimator": "k2"}).shape_rewards(t([1.0, 2.0]), rollout)
    assert_close(shaped, t([1.0 - 0.01 * 0.625, 2.0 - 0.01 * 0.25]))
