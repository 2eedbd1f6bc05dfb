"""The shipped multi-turn recipes fit end to end on the tiny model (two steps, through the real CLI)."""

from __future__ import annotations

import pytest

from grpo_lightning.cli.app import GRPOLightningCLI
from grpo_lightning.cli.resources import config_dir

CONFIGS = config_dir()


@pytest.mark.parametrize("recipe", ["calculator", "guess_number"])
def test_a_recipe_fits_and_logs_its_episodes(recipe, tiny_model_dir, tmp_path, one_torch_thread):
    args = [
        "--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / f"recipes/{recipe}.yaml"),
        "--model.model", tiny_model_dir, "--model.sampling.group_size", "2", "--model.sampling.max_new_tokens", "6",
        "--data.batch_size", "2", "--data.num_train", "4", "--data.num_val", "2", "--data.val_batch_size", "2",
        "--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path),
        "--trainer.callbacks.dirpath", str(tmp_path / "ckpt"),
    ]  # fmt: skip
    cli = GRPOLightningCLI(args=args, run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2
    logged = cli.model.last_step_metrics
    assert logged["agent/turns"] >= 1 and "agent/tool_errors/bad_call" in logged
    assert logged["agent/model_tokens"] > 0
    assert "val/accuracy" in cli.trainer.callback_metrics
