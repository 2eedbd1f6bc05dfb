"""Specification of CISPO (MiniMax 2025, *MiniMax-M1*): its paper defaults, hand-computed hook
values, and the lower bound of its IS weight. Its surrogate's own case, its micro-batch invariance
and its printed configuration are the conformance suite's (tests/conformance/)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from grpo_lightning.errors import ConfigError
from grpo_lightning.variants import CISPO
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
    assert_constructs_without_loading(CISPO, monkeypatch)


def test_defaults_follow_the_papers():
    module = CISPO(model="unused")  # no lower bound on the IS weight; TRL's / ScaleRL's 5.0 above
    assert module.coefficients.beta == 0.0
    assert (module.settings.clip_eps_low, module.settings.clip_eps_high) == (None, 5.0)
    assert module.settings.kl_placement == "loss"
    assert module.hparams["loss"]["clip_eps_low"] == None  # what checkpoints and the CLI record


# ------------------------------------------------------------------ hand-computed hook values

# REWARDS, LOSS and MASK, and their hand-worked values, are in tests/helpers.py.


def test_advantages_by_hand():
    advantages = CISPO(model="unused").advantages(t(REWARDS))
    assert_close(advantages, t([[Z, -Z, 0.0, 0.0], [0.0] * 4]))
    assert torch.equal(advantages[1], torch.zeros(4, dtype=torch.float64))


def test_aggregate_on_a_ragged_mask_by_hand():
    module = CISPO(model="unused", sampling={"max_new_tokens": 4})
    assert_close(module.aggregate(t(LOSS), t(MASK)), t(2.75))  # token mean over the batch: 11 / 4 tokens
    assert_aggregate_adds_up_over_halves(module)


# ------------------------------------------------------------------ the IS weight's lower bound


def test_cispo_lower_bound_is_checked_by_the_base_when_given():
    assert CISPO(model="unused", loss={"clip_eps_low": 0.2}).settings.clip_eps_low == 0.2
    with pytest.raises(ConfigError, match="clip_eps_low"):
        CISPO(model="unused", loss={"clip_eps_low": 1.5})


def _cispo_case():
    # Row 0, A = +1: r = 0.3 / 0.1 = 3 (inside [0, 6]) and r = 0.7 / 0.1 = 7 (above 1 + 5 = 6).
    # Row 1, A = -2: r = 0.01 / 0.5 = 0.02 (far below 1) and r = 1.
    logp = t([[math.log(0.3), math.log(0.7)], [math.log(0.01), math.log(0.25)]]).requires_grad_()
    old = t([[math.log(0.1), math.log(0.1)], [math.log(0.5), math.log(0.25)]])
    return logp, old, t([1.0, -2.0]), t([[1.0, 1.0], [1.0, 1.0]])


def test_cispo_with_a_lower_bound_clamps_the_weight_and_still_passes_the_gradient():
    module = CISPO(model="unused", loss={"clip_eps_low": 0.2})
    logp, old, advantages, mask = _cispo_case()
    loss = module.token_loss(logp, old, advantages, mask)
    # r = 0.02 -> w = 0.8: -0.8 * -2 * log 0.01 = -7.368272297580946, gradient -0.8 * -2 = 1.6.
    assert_close(loss.detach()[1, 0], t(-7.368272297580946))
    assert_close(token_grad(loss, logp), t([[-3.0, -6.0], [1.6, 2.0]]))
    assert module.step_metrics.compute_and_reset()["clip_ratio/low"] == pytest.approx(0.25)
