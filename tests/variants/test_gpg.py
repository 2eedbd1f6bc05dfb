"""Specification of GPG (Chu et al. 2025): its parts and defaults. Its parts' own cases are the
conformance suite's (tests/conformance/)."""

from __future__ import annotations

from grpo_lightning import variants


def test_each_preset_names_its_parts_and_the_papers_defaults():
    module = variants.GPG("unused")
    settings = module.settings
    assert (settings.advantage, settings.surrogate, settings.aggregation) == ("gpg", "reinforce", "token_mean")
    assert module.coefficients.beta == 0.0
