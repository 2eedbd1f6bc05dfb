"""Specification of VESPO (arXiv 2602.10693): its parts and defaults, its weight at the paper's
values, and the rollout correction it refuses."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_lightning import variants
from grpo_lightning.algorithms.surrogates import vespo_weight
from grpo_lightning.errors import ConfigError


def test_each_preset_names_its_parts_and_the_papers_defaults():
    module = variants.VESPO("unused")
    settings = module.settings
    assert (settings.advantage, settings.surrogate, settings.aggregation) == ("group_std", "vespo", "token_mean")
    assert dict(settings.surrogate_options) == {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0}


@pytest.mark.parametrize(
    "w, advantage, phi",
    [(1.0, 1.0, 1.0), (1.0, -1.0, 1.0), (0.5, 1.0, 1.1204), (2.0, 1.0, 0.1991), (0.5, -1.0, 0.3398), (2.0, -1.0, 1.0827)],
)
def test_vespo_weight_matches_the_papers_values(w, advantage, phi):
    got = vespo_weight(torch.tensor([math.log(w)]), torch.tensor([advantage >= 0]), 2.0, 3.0, 3.0, 2.0)
    assert got.item() == pytest.approx(phi, abs=1e-4)


def test_vespo_refuses_the_rollout_correction():
    with pytest.raises(ConfigError, match="^sampling.correction: does not apply to VESPO"):
        variants.VESPO("unused", sampling={"correction": "token_truncate"})
