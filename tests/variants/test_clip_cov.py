"""Specification of Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
Reasoning Language Models"): the settings it refuses, and the tokens whose gradient it detaches, by
hand and over many draws. Its defaults and its micro-batch invariance, shared with KL-Cov, are
tests/variants/test_covariance.py."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from grpo_lightning.errors import ConfigError
from grpo_lightning.variants.covariance import clip_cov_tokens
from grpo_lightning.variants.clip_cov import ClipCov
from tests.helpers import COV_ADV, COV_LOGP, COV_MASK, RHO, t


@pytest.mark.parametrize(
    "cls, kwargs, field",
    [
        (ClipCov, {"clip_cov_ratio": 0.0}, "clip_cov_ratio"),
        (ClipCov, {"clip_cov_ratio": 1.5}, "clip_cov_ratio"),
        (ClipCov, {"clip_cov_lb": 5.0, "clip_cov_ub": 5.0}, "clip_cov_lb, clip_cov_ub"),
        (ClipCov, {"clip_cov_lb": 6.0}, "clip_cov_lb, clip_cov_ub"),
    ],
)
def test_invalid_settings_are_refused_naming_the_field(cls, kwargs, field):
    with pytest.raises(ConfigError, match=rf"^{field}: .*the paper"):
        cls(model="unused", **kwargs)


# ------------------------------------------------------------------ hand-computed values

# COV_LOGP, COV_MASK, COV_ADV and RHO, and their hand-worked values, are in tests/helpers.py.


def test_clip_cov_detaches_the_tokens_in_range_by_hand():
    # [1, 2] holds one token (Cov 1.8, row 1, t1); the budget floor(0.4 * 5) = 2 is capped at 1.
    module = ClipCov(model="unused", clip_cov_ratio=0.4, clip_cov_lb=1.0, clip_cov_ub=2.0)
    logp = t(COV_LOGP).requires_grad_()
    loss = module.token_loss(logp, t(COV_LOGP) - 0.1, t(COV_ADV), t(COV_MASK))
    r = RHO
    assert_close(loss.detach(), t([[-r, -r, -r, -r], [r, r, r, r]]))  # the value is kept
    total = module.aggregate(loss, t(COV_MASK))
    assert_close(total.detach(), t(-0.22103418361512954))  # (-3r + 2r) / 5
    (grad,) = torch.autograd.grad(total, logp)
    g = 0.22103418361512954  # rho / 5
    assert_close(grad, t([[-g, -g, -g, 0.0], [g, 0.0, 0.0, 0.0]]))  # no gradient on the detached token
    assert module.step_metrics.compute_and_reset()["clip_cov/detached_frac"] == pytest.approx(0.2)


def test_clip_cov_leaves_out_tokens_the_ppo_clip_already_stops():
    # [0.5, 2] holds Cov 0.8 (row 0, t0) and 1.8 (row 1, t1); budget floor(0.2 * 5) = 1.
    # Row 1, t1 has rho = exp(-0.5) = 0.61 < 0.8 with A = -1: clipped, so row 0, t0 is the one, whatever the seed.
    old = t(COV_LOGP) - 0.1
    old[1, 1] = COV_LOGP[1][1] + 0.5
    for seed in range(5):
        module = ClipCov(model="unused", clip_cov_ratio=0.2, clip_cov_lb=0.5, clip_cov_ub=2.0, clip_cov_seed=seed)
        chosen = module.choose_tokens(t(COV_LOGP), old, t(COV_ADV), t(COV_MASK))
        assert chosen.tolist() == [[True, False, False, False], [False, False, False, False]]


def test_clip_cov_draws_uniformly_among_the_candidates_and_reproducibly():
    cov = torch.arange(100, dtype=torch.float64).view(1, 100) / 10  # 0.0, 0.1, ..., 9.9
    mask = torch.ones(1, 100)
    in_range = (cov >= 1.0) & (cov <= 5.0)
    assert int(in_range.sum()) == 41  # 1.0, 1.1, ..., 5.0

    def draw(seed):
        return clip_cov_tokens(cov, mask, 0.1, 1.0, 5.0, torch.Generator().manual_seed(seed))

    first = draw(0)
    assert int(first.sum()) == 10  # floor(0.1 * 100)
    assert not (first & ~in_range).any()
    assert torch.equal(draw(0), first)
    assert not torch.equal(draw(1), first)
    # Over many draws every candidate is picked, about 10 / 41 of the time.
    counts = sum(draw(seed).double() for seed in range(400))
    assert counts[~in_range].sum() == 0
    assert counts[in_range].min() > 0.1 * 400 and counts[in_range].max() < 0.4 * 400


def test_clip_cov_seed_and_step_set_the_draw():
    logp = torch.randn(4, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    advantages, mask = t([2.0, 1.0, -1.0, -2.0]), torch.ones(4, 50)
    kwargs = {"clip_cov_ratio": 0.05, "clip_cov_lb": -100.0, "clip_cov_ub": 100.0}
    chosen = [ClipCov(model="unused", clip_cov_seed=s, **kwargs).choose_tokens(logp, logp, advantages, mask) for s in (0, 0, 1)]
    assert int(chosen[0].sum()) == 10
    assert torch.equal(chosen[0], chosen[1]) and not torch.equal(chosen[0], chosen[2])
