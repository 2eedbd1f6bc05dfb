"""Specification of GRPO (Shao et al. 2024, *DeepSeekMath*): its paper defaults and hand-computed
hook values. Its parts' own cases and its micro-batch invariance are the conformance suite's
(tests/conformance/)."""

from __future__ import annotations

import torch
from torch.testing import assert_close

from grpo_lightning.variants import GRPO
from tests.helpers import LOSS, MASK, REWARDS, Z, assert_clip_higher_boundary, assert_constructs_without_loading, t


# ------------------------------------------------------------------ construction and defaults


def test_construction_loads_nothing_and_is_instant(monkeypatch):
    assert_constructs_without_loading(GRPO, monkeypatch)


def test_defaults_follow_the_papers():
    module = GRPO(model="unused")  # DeepSeekMath: beta 0.04, eps 0.2, k3
    assert module.coefficients.beta == 0.04
    assert (module.settings.clip_eps_low, module.settings.clip_eps_high) == (0.2, 0.2)
    assert module.settings.kl_estimator == "k3"
    assert module.settings.kl_placement == "loss"


# ------------------------------------------------------------------ hand-computed hook values

# REWARDS, LOSS and MASK, and their hand-worked values, are in tests/helpers.py.


def test_advantages_by_hand():
    advantages = GRPO(model="unused").advantages(t(REWARDS))
    assert_close(advantages, t([[Z, -Z, 0.0, 0.0], [0.0] * 4]))
    assert torch.equal(advantages[1], torch.zeros(4, dtype=torch.float64))


def test_aggregate_on_a_ragged_mask_by_hand():
    module = GRPO(model="unused", sampling={"max_new_tokens": 4})
    assert_close(module.aggregate(t(LOSS), t(MASK)), t(3.5))  # sequence mean of token means: (6/3 + 5/1) / 2


def test_token_loss_clip_higher_boundary():
    # eps_high 0.2: -min(1.25 * 1, 1.2 * 1) = -1.2, clipped: no gradient
    assert_clip_higher_boundary(GRPO(model="unused"), high_loss=-1.2, high_grad=0.0, high_clipped=0.5)
