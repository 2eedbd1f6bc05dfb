"""Specification of Dr. GRPO (Liu et al. 2025, *Understanding R1-Zero-Like Training*): its paper
defaults and hand-computed hook values: no length or std normalisation."""

from __future__ import annotations

import torch
from torch.testing import assert_close

from grpo_lightning.variants import DrGRPO
from tests.helpers import LOSS, MASK, REWARDS, assert_clip_higher_boundary, assert_constructs_without_loading, t


# ------------------------------------------------------------------ construction and defaults


def test_construction_loads_nothing_and_is_instant(monkeypatch):
    assert_constructs_without_loading(DrGRPO, monkeypatch)


def test_defaults_follow_the_papers():
    module = DrGRPO(model="unused")  # Dr. GRPO: no KL term
    assert module.coefficients.beta == 0.0
    assert (module.settings.clip_eps_low, module.settings.clip_eps_high) == (0.2, 0.2)
    assert module.settings.kl_estimator == "k3"
    assert module.settings.kl_placement == "loss"


# ------------------------------------------------------------------ hand-computed hook values

# REWARDS, LOSS and MASK, and their hand-worked values, are in tests/helpers.py.


def test_advantages_by_hand():
    advantages = DrGRPO(model="unused").advantages(t(REWARDS))
    assert_close(advantages, t([[1.0, -1.0, 0.0, 0.0], [0.0] * 4]))  # centred only
    assert torch.equal(advantages[1], torch.zeros(4, dtype=torch.float64))


def test_aggregate_on_a_ragged_mask_by_hand():
    module = DrGRPO(model="unused", sampling={"max_new_tokens": 4})
    assert_close(module.aggregate(t(LOSS), t(MASK)), t(1.375))  # token sum over N * max_new_tokens: 11 / (2 * 4)


def test_token_loss_clip_higher_boundary():
    # eps_high 0.2: -min(1.25 * 1, 1.2 * 1) = -1.2, clipped: no gradient
    assert_clip_higher_boundary(DrGRPO(model="unused"), high_loss=-1.2, high_grad=0.0, high_clipped=0.5)
