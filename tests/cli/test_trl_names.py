"""The table of TRL's ``GRPOConfig`` names: every option it names exists, and the documentation prints it."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_lightning.cli.trl_names import TRL_NAMES, markdown_table
from grpo_lightning.cli.user_errors import init_parameters, nested_fields

#: The class each top-level key of the command line configures.
OWNERS = {
    "model": "grpo_lightning.training.module.GroupPolicyOptimization",
    "data": "grpo_lightning.data.PromptDataModule",
    "trainer": "lightning.pytorch.Trainer",
    "completions": "grpo_lightning.evaluation.completions.CompletionLog",
}
TOP_LEVEL = ("--model", "--seed_everything")


@pytest.mark.parametrize("name", TRL_NAMES)
def test_every_option_the_trl_table_names_exists(name):
    option = TRL_NAMES[name][0]
    if option in TOP_LEVEL:
        return
    key, *groups, field = option.removeprefix("--").split(".")
    owner = OWNERS[key]
    fields = nested_fields(owner, groups) if groups else init_parameters(owner)
    assert field in fields, option


def test_the_configuration_page_prints_the_trl_table():
    page = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    assert markdown_table() in page
