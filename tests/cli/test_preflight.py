"""The checks of a configuration that run before the model loads."""

from __future__ import annotations

import json

import pytest

from grpo_lightning.cli.preflight import check_variant, has_chat_template
from grpo_lightning.cli.variants import register_shipped_variants, shipped_variants
from grpo_lightning.errors import ConfigError
from grpo_lightning.training.module import GroupPolicyOptimization


@pytest.mark.parametrize("class_path", shipped_variants().values())
def test_every_shipped_variant_names_its_parts(class_path):
    register_shipped_variants()
    module_name, _, name = class_path.rpartition(".")
    check_variant(getattr(__import__(module_name, fromlist=[name]), name), {})


def test_the_base_module_with_both_parts_given_passes():
    check_variant(GroupPolicyOptimization, {"advantage": "group_std", "aggregation": "token_mean"})
    with pytest.raises(ConfigError, match="names no aggregation;"):
        check_variant(GroupPolicyOptimization, {"advantage": "group_std"})


def test_a_chat_template_is_read_from_the_tokenizer_config_alone(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert has_chat_template(str(tmp_path)) is True
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert has_chat_template(str(tmp_path)) is False
    assert has_chat_template("Qwen/Qwen2.5-0.5B-Instruct") is None  # a hub id: checked when it loads
