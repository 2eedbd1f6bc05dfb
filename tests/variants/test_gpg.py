"""Specification of GPG (Chu et al. 2025): its parts and defaults. Its parts' own cases are the
conformance suite's (tests/conformance/)."""

from __future__ import annotations

from grpo_lightning import variants


def test_each_preset_names_its_parts_and_the_papers_defaults():
    module = variants.GPG("unused")
    assert (module.advantage_name, module.surrogate_name, module.aggregation_name) == ("gpg", "reinforce", "token_mean")
    defaults = {"beta": 0.0}
    for option, value in defaults.items():  # the module's (as resolved for its surrogate), else its loss option
        assert getattr(module, option, getattr(module.loss_options, option, None)) == value, option
