"""Specification of SAPO (Gao et al. 2025, *Soft Adaptive Policy Optimization*): its paper
defaults, hand-computed hook values, its temperatures and the clip settings it refuses. Its
surrogate's own case, its micro-batch invariance and its printed configuration are the conformance
suite's (tests/conformance/)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from grpo_lightning.errors import ConfigError
from grpo_lightning.variants import SAPO
from tests.helpers import (
    LOSS,
    MASK,
    REWARDS,
    Z,
    assert_aggregate_adds_up_over_halves,
    assert_constructs_without_loading,
    t,
    token_grad,
)


# ------------------------------------------------------------------ construction and defaults


def test_construction_loads_nothing_and_is_instant(monkeypatch):
    assert_constructs_without_loading(SAPO, monkeypatch)


def test_defaults_follow_the_papers():
    module = SAPO(model="unused")  # no clip at all: the base's range, which it refuses to change
    assert module.coefficients.beta == 0.0
    assert (module.settings.clip_eps_low, module.settings.clip_eps_high) == (0.2, 0.2)
    assert module.settings.kl_placement == "loss"
    assert module.hparams["loss"]["clip_eps_low"] == 0.2  # what checkpoints and the CLI record


# ------------------------------------------------------------------ hand-computed hook values

# REWARDS, LOSS and MASK, and their hand-worked values, are in tests/helpers.py.


def test_advantages_by_hand():
    advantages = SAPO(model="unused").advantages(t(REWARDS))
    assert_close(advantages, t([[Z, -Z, 0.0, 0.0], [0.0] * 4]))
    assert torch.equal(advantages[1], torch.zeros(4, dtype=torch.float64))


def test_aggregate_on_a_ragged_mask_by_hand():
    module = SAPO(model="unused", sampling={"max_new_tokens": 4})
    assert_close(module.aggregate(t(LOSS), t(MASK)), t(3.5))  # sequence mean of token means: (6/3 + 5/1) / 2
    assert_aggregate_adds_up_over_halves(module)


# ------------------------------------------------------------------ the soft gate


def test_sapo_temperatures_default_to_the_paper_and_must_be_positive():
    module = SAPO(model="unused")
    assert (module.tau_pos, module.tau_neg) == (1.0, 1.05)
    with pytest.raises(ConfigError, match="tau_pos"):
        SAPO(model="unused", tau_pos=0.0)
    with pytest.raises(ConfigError, match="tau_neg"):
        SAPO(model="unused", tau_neg=-1.0)


@pytest.mark.parametrize(("option", "value"), [("clip_eps_low", 0.3), ("clip_eps_high", 0.3), ("delta", 3.0), ("clip_ratio_c", 3.0)])
def test_sapo_refuses_a_clip_range_it_would_not_use(option, value):
    """Its gate has no clip: a clip setting on it would change nothing, so it is an error."""
    with pytest.raises(ConfigError, match=f"^loss.{option}: does not apply to SAPO \\(its soft gate replaces the ratio clip\\)"):
        SAPO(model="unused", loss={option: value})


@pytest.mark.parametrize("tau_pos, tau_neg", [(1.0, 1.05), (0.3, 7.0)])
def test_sapo_gradient_on_policy_is_minus_the_advantage(tau_pos, tau_neg):
    module = SAPO(model="unused", tau_pos=tau_pos, tau_neg=tau_neg)
    logp = t([[-0.7, -2.0], [-1.3, -0.1], [-0.4, -0.4]]).requires_grad_()
    advantages = t([1.5, -0.5, 0.0])
    loss = module.token_loss(logp, logp.detach(), advantages, torch.ones(3, 2, dtype=torch.float64))
    assert_close(token_grad(loss, logp), t([[-1.5, -1.5], [0.5, 0.5], [0.0, 0.0]]))
