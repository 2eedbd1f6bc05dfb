"""Specification of KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
Reasoning Language Models"): the settings it refuses, and its penalty on the top tokens by
covariance, by hand. Its defaults and its micro-batch invariance, shared with Clip-Cov, are
tests/variants/test_covariance.py."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from grpo_lightning.errors import ConfigError
from grpo_lightning.variants.kl_cov import KLCov
from tests.helpers import COV_ADV, COV_LOGP, COV_MASK, RHO, t


@pytest.mark.parametrize(
    "cls, kwargs, field",
    [
        (KLCov, {"kl_cov_ratio": 0.0}, "kl_cov_ratio"),
        (KLCov, {"kl_coef": -0.1}, "kl_coef"),
    ],
)
def test_invalid_settings_are_refused_naming_the_field(cls, kwargs, field):
    with pytest.raises(ConfigError, match=rf"^{field}: .*the paper"):
        cls(model="unused", **kwargs)


# ------------------------------------------------------------------ hand-computed values

# COV_LOGP, COV_MASK, COV_ADV and RHO, and their hand-worked values, are in tests/helpers.py.


def test_kl_cov_penalises_the_top_tokens_by_hand():
    module = KLCov(model="unused", kl_cov_ratio=0.4)  # 2 of 5 tokens: Cov 1.8 (row 1, t1) and 0.8 (row 0, t0)
    logp = t(COV_LOGP).requires_grad_()
    loss = module.token_loss(logp, t(COV_LOGP) - 0.1, t(COV_ADV), t(COV_MASK))
    # -A rho everywhere (clip inactive); + |logp - old| = 0.1 on the two chosen tokens.
    r = RHO
    expected = [[-r + 0.1, -r, -r, -r], [r, r + 0.1, r, r]]
    assert_close(loss.detach(), t(expected))
    total = module.aggregate(loss, t(COV_MASK))
    # token mean: (-3r + 2r + 0.2) / 5 = (0.2 - r) / 5 = -0.18103418361512954
    assert_close(total.detach(), t(-0.18103418361512954))
    (grad,) = torch.autograd.grad(total, logp)
    # d/dlogp: (-A rho + sign(logp - old) * [chosen]) / 5; 0 on padding.
    g = 0.22103418361512954  # rho / 5
    assert_close(grad, t([[-g + 0.2, -g, -g, 0.0], [g, g + 0.2, 0.0, 0.0]]))
    assert module.step_metrics.compute_and_reset()["kl_cov/penalised_frac"] == pytest.approx(0.4)


def test_kl_cov_penalty_has_no_gradient_on_policy():
    module = KLCov(model="unused", kl_cov_ratio=0.4)
    logp = t(COV_LOGP).requires_grad_()
    loss = module.token_loss(logp, logp.detach(), t(COV_ADV), t(COV_MASK))
    (grad,) = torch.autograd.grad(module.aggregate(loss, t(COV_MASK)), logp)
    # rho = 1, |logp - old| = 0 and its gradient is 0: -A / 5 only.
    assert_close(grad, t([[-0.2, -0.2, -0.2, 0.0], [0.2, 0.2, 0.0, 0.0]]))
