"""Specification of ProcessGRPO (GRPO with process supervision): the settings it refuses, and fits
through the CLI with the shipped config, on the rule-based step scorer and on a process reward model.
The step rewards, their advantages and the reward model by hand are tests/rewards/test_process_rewards.py."""

from __future__ import annotations

import json
import math

import pytest

from grpo_lightning.cli.app import GRPOLightningCLI
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.errors import ConfigError
from grpo_lightning.variants import ProcessGRPO

CONFIGS = config_dir()


def test_bad_settings_name_the_field(tiny_model_dir):
    with pytest.raises(ConfigError, match="step_delimiter"):
        ProcessGRPO(tiny_model_dir, step_delimiter="")
    with pytest.raises(ConfigError, match="rewards.scale: does not apply to ProcessGRPO"):
        ProcessGRPO(tiny_model_dir, rewards={"scale": "none"})


@pytest.mark.parametrize("step_reward", ["rule", "model"])
def test_a_fit_through_the_cli(tiny_model_dir, prm_dir, tmp_path, step_reward, one_torch_thread):
    args = [
        "fit",
        "--config",
        str(CONFIGS / "trainer/cpu.yaml"),
        "--config",
        str(CONFIGS / "data/arithmetic.yaml"),
        "--config",
        str(CONFIGS / "variant/process_grpo.yaml"),
        "--config",
        str(CONFIGS / "model/tiny.yaml"),
        "--model.model",
        tiny_model_dir,
        "--trainer.logger.init_args.save_dir",
        str(tmp_path),
        "--trainer.max_steps",
        "2",
        "--data.batch_size",
        "2",
        "--model.sampling.group_size",
        "3",
        "--model.sampling.max_new_tokens",
        "8",
        "--data.max_val_samples",
        "4",
        "--validate_before_fit",
        "false",
        "--trainer.limit_val_batches",
        "0",
        "--completions.jsonl",
        "true",
    ]
    if step_reward == "model":
        spec = {"class_path": "grpo_lightning.rewards.ProcessRewardModel", "init_args": {"path": prm_dir}}
        args += ["--model.step_reward_func", json.dumps(spec)]
    cli = GRPOLightningCLI(args=args)
    metrics = cli.model.last_step_metrics
    assert cli.trainer.global_step == 2 and math.isfinite(metrics["loss"]) and metrics["process/steps_per_completion"] > 0
    assert cli.model.last_advantages.dim() == 2  # per token
    lines = (tmp_path / "process_grpo" / "version_0" / "completions.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 2 * 3 and all(math.isfinite(json.loads(line)["advantage"]) for line in lines)
