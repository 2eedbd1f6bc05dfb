"""Specification of MaxRL (*Maximum Likelihood Reinforcement Learning*; prime-rl's ``max_rl``): its
parts and defaults, and its advantage over the success rate by hand."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from grpo_lightning import variants
from grpo_lightning.algorithms import ADVANTAGES


def test_each_preset_names_its_parts_and_the_papers_defaults():
    module = variants.MaxRL("unused")
    settings = module.settings
    assert (settings.advantage, settings.surrogate, settings.aggregation) == ("max_rl", "ppo_clip", "seq_mean_token_mean")
    assert (settings.clip_eps_low, module.coefficients.beta) == (0.2, 0.0)


def test_max_rl_divides_the_centred_reward_by_the_success_rate():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    want = torch.tensor([[0.75, -0.25, -0.25, -0.25], [0.0] * 4, [0.0] * 4])
    want[0] /= 0.25 + 1e-6  # success rate 1/4: +3 for the success, -1 for each failure
    assert_close(ADVANTAGES["max_rl"](rewards), want)
    with pytest.raises(ValueError, match="^max_rl: a group's rewards differ with a mean <= 0"):
        ADVANTAGES["max_rl"](torch.tensor([[1.0, -2.0]]))
