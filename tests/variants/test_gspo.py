"""Specification of GSPO (Zheng et al. 2025, *Group Sequence Policy Optimization*): its paper
defaults and hand-computed hook values. Its sequence-ratio surrogate's own case is the conformance
suite's (tests/conformance/)."""

from __future__ import annotations

import torch
from torch.testing import assert_close

from grpo_lightning.variants import GSPO
from tests.helpers import LOSS, MASK, REWARDS, Z, assert_constructs_without_loading, t


# ------------------------------------------------------------------ construction and defaults


def test_construction_loads_nothing_and_is_instant(monkeypatch):
    assert_constructs_without_loading(GSPO, monkeypatch)


def test_defaults_follow_the_papers():
    module = GSPO(model="unused")  # GSPO: sequence-ratio clip range
    assert module.coefficients.beta == 0.0
    assert (module.settings.clip_eps_low, module.settings.clip_eps_high) == (0.0003, 0.0004)
    assert module.settings.kl_estimator == "k3"
    assert module.settings.kl_placement == "loss"


# ------------------------------------------------------------------ hand-computed hook values

# REWARDS, LOSS and MASK, and their hand-worked values, are in tests/helpers.py.


def test_advantages_by_hand():
    advantages = GSPO(model="unused").advantages(t(REWARDS))
    assert_close(advantages, t([[Z, -Z, 0.0, 0.0], [0.0] * 4]))
    assert torch.equal(advantages[1], torch.zeros(4, dtype=torch.float64))


def test_aggregate_on_a_ragged_mask_by_hand():
    module = GSPO(model="unused", sampling={"max_new_tokens": 4})
    assert_close(module.aggregate(t(LOSS), t(MASK)), t(3.5))  # same reduction as GRPO: (6/3 + 5/1) / 2
