"""Specification of DPPO (*Rethinking the Trust Region in LLM Reinforcement Learning*, arXiv
2602.04879): its parts and defaults, the divergence that picks its surrogate, and a ratio that
overflows."""

from __future__ import annotations

import pytest
import torch

from grpo_lightning import variants
from grpo_lightning.algorithms import SURROGATES
from grpo_lightning.errors import ConfigError
from tests.helpers import token_grad


def surrogate_loss(name, logp, old_logp, advantages, mask, **settings):
    return SURROGATES[name].loss(logp, old_logp, advantages, mask, **settings)[0]


def test_each_preset_names_its_parts_and_the_papers_defaults():
    module = variants.DPPO("unused")
    settings = module.settings
    assert (settings.advantage, settings.surrogate, settings.aggregation) == ("group_std", "dppo_tv", "token_mean")
    # the clip bounds as resolved for its surrogate, and the loss option
    assert dict(settings.surrogate_options) == {"clip_eps_low": 0.15, "clip_eps_high": 0.15, "clip_ratio_c": 20.0}


def test_dppo_divergence_picks_the_surrogate_and_its_bounds():
    module = variants.DPPO("unused", divergence="kl")
    assert (module.settings.surrogate, module.settings.clip_eps_low, module.settings.clip_eps_high) == ("dppo_kl", 0.05, 0.05)
    with pytest.raises(ConfigError, match="^divergence: kl is the surrogate dppo_kl"):
        variants.DPPO("unused", divergence="kl", loss={"surrogate": "dppo_tv"})


def test_dppo_without_a_cap_stays_finite_where_the_ratio_overflows():
    logp, old = torch.tensor([[0.0]], requires_grad=True), torch.tensor([[-200.0]])  # r = e^200 overflows float32
    loss = surrogate_loss("dppo_tv", logp, old, torch.tensor([[-1.0]]), None, clip_eps_low=1.0, clip_eps_high=1.0,
                          clip_ratio_c=None)  # fmt: skip
    assert torch.isfinite(token_grad(loss.sum(), logp)).all()
