"""Specification of GMPO (Zhao et al. 2025, *Geometric-Mean Policy Optimization*): its paper
defaults and hand-computed hook values. Its surrogate's own case, its micro-batch invariance and its
printed configuration are the conformance suite's (tests/conformance/)."""

from __future__ import annotations

import torch
from torch.testing import assert_close

from grpo_lightning.variants import GMPO
from tests.helpers import (
    LOSS,
    MASK,
    REWARDS,
    Z,
    assert_aggregate_adds_up_over_halves,
    assert_constructs_without_loading,
    t,
)


# ------------------------------------------------------------------ construction and defaults


def test_construction_loads_nothing_and_is_instant(monkeypatch):
    assert_constructs_without_loading(GMPO, monkeypatch)


def test_defaults_follow_the_papers():
    module = GMPO(model="unused")  # log-space clip, ratios within (e^-0.4, e^0.4)
    assert module.coefficients.beta == 0.0
    assert (module.settings.clip_eps_low, module.settings.clip_eps_high) == (0.4, 0.4)
    assert module.settings.kl_placement == "loss"
    assert module.hparams["loss"]["clip_eps_low"] == 0.4  # what checkpoints and the CLI record


# ------------------------------------------------------------------ hand-computed hook values

# REWARDS, LOSS and MASK, and their hand-worked values, are in tests/helpers.py.


def test_advantages_by_hand():
    advantages = GMPO(model="unused").advantages(t(REWARDS))
    assert_close(advantages, t([[Z, -Z, 0.0, 0.0], [0.0] * 4]))
    assert torch.equal(advantages[1], torch.zeros(4, dtype=torch.float64))


def test_aggregate_on_a_ragged_mask_by_hand():
    module = GMPO(model="unused", sampling={"max_new_tokens": 4})
    assert_close(module.aggregate(t(LOSS), t(MASK)), t(3.5))  # the mean over completions of a loss on every token
    assert_aggregate_adds_up_over_halves(module)
