"""Specification of LUSPO (*Length-Unbiased Sequence Policy Optimization*, 2026): its parts and
defaults, and its length-weighted loss by hand beyond its parts' cases (tests/conformance/)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from grpo_lightning import variants
from tests.helpers import token_grad

# Two completions of lengths 3 and 5 (width 5), advantages +1 and -1.
MASK = torch.tensor([[1.0, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
SIGNS = torch.tensor([1.0, -1.0])


def test_each_preset_names_its_parts_and_the_papers_defaults():
    module = variants.LUSPO("unused")
    settings = module.settings
    assert (settings.advantage, settings.surrogate, settings.aggregation) == ("group_std", "gspo", "seq_mean_token_sum")
    assert (settings.clip_eps_low, settings.clip_eps_high, module.coefficients.beta) == (2e-3, 2.5e-3, 0.0)


def test_luspo_on_policy_is_the_length_weighted_loss_and_its_gradient():
    logp = torch.full((2, 5), -1.0, requires_grad=True)
    module = variants.LUSPO("unused")
    loss = module.aggregate(module.token_loss(logp, logp.detach(), SIGNS, MASK), MASK)
    # s_i = 1 on-policy: l_i = -A_i; L = (3 * (-1) + 5 * (+1)) / 2 = +1.0.
    assert loss.item() == pytest.approx(1.0)
    # grad L = -(1/B) sum_i A_i sum_t grad log pi_it: -1/2 on the first row's tokens, +1/2 on the second's.
    assert_close(token_grad(loss, logp), -0.5 * SIGNS.unsqueeze(1) * MASK)
