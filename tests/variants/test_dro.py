"""Specification of DRO (Richemond et al. 2024, *Offline Regularised RL*): its parts and defaults. Its
parts' own cases are the conformance suite's (tests/conformance/)."""

from __future__ import annotations

from grpo_lightning import variants


def test_each_preset_names_its_parts_and_the_papers_defaults():
    module = variants.DRO("unused")
    settings = module.settings
    assert (settings.advantage, settings.surrogate, settings.aggregation) == ("group_std", "dro", "seq_mean_token_sum")
    assert (module.dro_beta, module.coefficients.beta) == (0.1, 0.0)
