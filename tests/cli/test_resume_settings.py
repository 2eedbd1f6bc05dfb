"""``grpo-lightning fit --ckpt_path``: a model setting given on the command line or in a config that
differs from the checkpoint's is refused before any work, naming the field and both values (Lightning
would load the checkpoint's over it, silently); the same settings, none, a trainer setting or how to
evaluate resume, and so does the base's path where the checkpoint can check the weights found there
(grpo_lightning.cli.resume_settings)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_lightning.cli.app import main
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.runtime.checkpoint_io import load_checkpoint_file

CONFIGS = config_dir()


def fit_args(model_dir: str, root: Path, *extra: str, steps: int) -> list[str]:
    return [
        "fit", "--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml"),
        "--config", str(CONFIGS / "variant/grpo.yaml"), "--model.model", model_dir,
        "--model.sampling.group_size", "2", "--model.sampling.max_new_tokens", "4", "--model.evaluation.max_new_tokens", "4",
        "--data.batch_size", "2", "--data.num_train", "8", "--data.num_val", "2", "--data.val_batch_size", "2",
        "--trainer.max_steps", str(steps), "--trainer.val_check_interval", "100", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false", "--trainer.default_root_dir", str(root),
        "--trainer.logger.init_args.save_dir", str(root), "--validate_before_fit", "false", *extra,
    ]  # fmt: skip


LEARNING_RATE = ("--model.optim.learning_rate", "0.001")


@pytest.fixture
def one_step(tiny_model_dir, tmp_path, one_torch_thread) -> Path:
    """``tmp_path`` with a one-step fit at learning rate 1e-3; returns its last.ckpt."""
    main(fit_args(tiny_model_dir, tmp_path, *LEARNING_RATE, steps=1))
    last = tmp_path / "grpo" / "version_0" / "checkpoints" / "last.ckpt"
    assert load_checkpoint_file(last)["global_step"] == 1
    return last


def test_a_resume_with_another_learning_rate_is_refused_naming_the_field(one_step, tiny_model_dir, tmp_path, capsys):
    capsys.readouterr()
    args = fit_args(tiny_model_dir, tmp_path, "--model.optim.learning_rate", "1e-4", "--ckpt_path", "last", steps=2)
    with pytest.raises(SystemExit) as done:
        main(args, report_errors=True)
    assert done.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    assert "model.optim.learning_rate: 0.0001 on the command line, 0.001 in the checkpoint" in errors[0]
    assert "Drop this option to resume as saved, or start a new fit" in errors[0]
    assert load_checkpoint_file(one_step)["global_step"] == 1  # refused before any work
    assert not (tmp_path / "grpo" / "version_1").exists()


def test_every_differing_setting_is_named_also_from_a_config_file(one_step, tiny_model_dir, tmp_path, capsys):
    config = tmp_path / "other.yaml"
    config.write_text("model:\n  init_args:\n    kl:\n      beta: 0.1\n")
    args = fit_args(tiny_model_dir, tmp_path, "--config", str(config), "--model.rewards.funcs", "[tests.helpers.length_parity_reward]",
                    "--ckpt_path", str(one_step), steps=2)  # fmt: skip
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(args, report_errors=True)
    assert done.value.code == 2
    error = capsys.readouterr().err
    assert "model.kl.beta: 0.1 in the configs, 0.04 in the checkpoint" in error
    assert "model.rewards.funcs: ['tests.helpers.length_parity_reward'] on the command line" in error
    assert load_checkpoint_file(one_step)["global_step"] == 1


@pytest.mark.parametrize("learning_rate", [LEARNING_RATE, ()], ids=["same", "not-given"])
def test_a_resume_with_the_checkpoints_settings_or_none_goes_on(learning_rate, one_step, tiny_model_dir, tmp_path, capsys):
    """The same learning rate, or none (the checkpoint's); a trainer setting (max_steps) and how to
    evaluate may change: the evaluation setting given is taken, and said."""
    args = fit_args(tiny_model_dir, tmp_path, *learning_rate, "--model.evaluation.max_new_tokens", "3",
                    "--ckpt_path", "last", steps=2)  # fmt: skip
    main(args)
    checkpoint = load_checkpoint_file(one_step)
    assert checkpoint["global_step"] == 2
    assert checkpoint["hyper_parameters"]["optim"]["learning_rate"] == 0.001
    assert checkpoint["hyper_parameters"]["evaluation"]["max_new_tokens"] == 3
    assert "--ckpt_path: model.evaluation.max_new_tokens 3 on the command line (the checkpoint's: 4)" in capsys.readouterr().err


def test_a_base_moved_to_another_folder_resumes_and_another_base_is_refused(one_step, tiny_model_dir, tmp_path, capsys):
    """``--model.model`` may name the base's new folder: the checkpoint records its base's fingerprint,
    and the weights found there are checked against it as they load."""
    moved = tmp_path / "moved"
    shutil.copytree(tiny_model_dir, moved)
    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    model = AutoModelForCausalLM.from_pretrained(other)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.5)
    model.save_pretrained(other)
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(fit_args(str(other), tmp_path, "--ckpt_path", "last", steps=2), report_errors=True)
    assert done.value.code == 2
    error = capsys.readouterr().err
    assert f"--ckpt_path: model.model '{other}' on the command line (the checkpoint's: '{tiny_model_dir}'" in error
    assert "now holds other weights than the run was trained from" in error
    assert load_checkpoint_file(one_step)["global_step"] == 1

    main(fit_args(str(moved), tmp_path, "--ckpt_path", "last", steps=2))
    checkpoint = load_checkpoint_file(one_step)
    assert checkpoint["global_step"] == 2 and checkpoint["hyper_parameters"]["model"] == str(moved)


@pytest.mark.parametrize("form", ["{FIELDS}", "{class_path: peft.LoraConfig, init_args: {FIELDS}}"])
def test_a_lora_setting_left_at_its_default_in_the_checkpoint_is_compared_too(form, tiny_model_dir, tmp_path, capsys,
                                                                               one_torch_thread):  # fmt: skip
    """The checkpoint records the LoRA fields set away from peft's defaults: a resume that sets another
    (use_rslora, a scale of alpha / sqrt(r) for alpha / r) is refused, not trained on silently; the same
    fields resume, in either form (the dict was refused against the checkpoint's, which adds the dropout)."""
    pytest.importorskip("peft")
    lora = form.replace("{FIELDS}", "{r: 4, lora_alpha: 8, target_modules: [q_proj, v_proj]}")
    main(fit_args(tiny_model_dir, tmp_path, "--model.policy.peft_config", lora, steps=1))
    capsys.readouterr()
    rslora = form.replace("{FIELDS}", "{r: 4, lora_alpha: 8, target_modules: [q_proj, v_proj], use_rslora: true}")
    with pytest.raises(SystemExit) as done:
        main(fit_args(tiny_model_dir, tmp_path, "--model.policy.peft_config", rslora, "--ckpt_path", "last", steps=2),
             report_errors=True)  # fmt: skip
    assert done.value.code == 2
    assert "use_rslora" in capsys.readouterr().err
    main(fit_args(tiny_model_dir, tmp_path, "--model.policy.peft_config", lora, "--ckpt_path", "last", steps=2))
