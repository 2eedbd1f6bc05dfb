"""Specification of DRO (Richemond et al. 2024, *Offline Regularised RL*): its parts and defaults. Its
parts' own cases are the conformance suite's (tests/conformance/)."""

from __future__ import annotations

from grpo_lightning import variants


def test_each_preset_names_its_parts_and_the_papers_defaults():
    module = variants.DRO("unused")
    assert (module.advantage_name, module.surrogate_name, module.aggregation_name) == ("group_std", "dro", "seq_mean_token_sum")
    defaults = {"dro_beta": 0.1, "beta": 0.0}
    for option, value in defaults.items():  # the module's (as resolved for its surrogate), else its loss option
        assert getattr(module, option, getattr(module.loss_options, option, None)) == value, option
