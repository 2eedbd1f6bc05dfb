"""Every validation writes each prompt's outcomes (``<log_dir>/outcomes/<prefix>-step<step>.csv.gz``):
one row per completion with the prompt's index and hash, the sample, the step, the reward and the
accuracy score, from which the logged validation metrics follow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from grpo_lightning.cli.app import GRPOLightningCLI
from grpo_lightning.cli.resources import config_dir
from grpo_lightning.evaluation.outcomes import OUTCOMES_FOLDER, prompt_hash, read_outcomes

CONFIGS = config_dir()
NUM_VAL, SAMPLES = 4, 2


def odd_length(prompts, completions, **columns):
    """Reward and accuracy at once: 1 for a completion of odd length, so samples of a prompt differ."""
    return [float(len(c) % 2) for c in completions]


@pytest.fixture(scope="module")
def fit(tiny_model_dir, tmp_path_factory, one_torch_thread) -> GRPOLightningCLI:
    """A 1-step fit validated before its step and after it: 4 prompts (batches of 3 and 1) x 2 samples."""
    root = tmp_path_factory.mktemp("outcomes")
    scorer = f"{__name__}.odd_length"
    return GRPOLightningCLI(
        args=[
            "fit",
            "--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml"),
            "--config", str(CONFIGS / "variant/grpo.yaml"), "--config", str(CONFIGS / "model/tiny.yaml"),
            "--model.model", tiny_model_dir, "--model.rewards.funcs", f"[{scorer}]",
            "--model.evaluation.accuracy_func", scorer, "--model.evaluation.samples", str(SAMPLES),
            "--model.evaluation.temperature", "1.0", "--model.evaluation.max_new_tokens", "4",
            "--model.sampling.max_new_tokens", "4", "--model.sampling.group_size", "2",
            "--data.batch_size", "2", "--data.num_train", "4", "--data.num_val", str(NUM_VAL), "--data.val_batch_size", "3",
            "--trainer.max_steps", "1", "--trainer.val_check_interval", "1", "--trainer.enable_progress_bar", "false",
            "--trainer.default_root_dir", str(root), "--trainer.logger.init_args.save_dir", str(root),
            "--trainer.callbacks.dirpath", str(root / "ckpt"),
        ]
    )  # fmt: skip


def outcome_files(fit: GRPOLightningCLI) -> list[Path]:
    return sorted((Path(fit.trainer.log_dir) / OUTCOMES_FOLDER).iterdir())


def test_each_validation_of_a_fit_writes_one_file_named_for_its_step(fit):
    assert [path.name for path in outcome_files(fit)] == ["val-step000000.csv.gz", "val-step000001.csv.gz"]
    assert [read_outcomes(path).step for path in outcome_files(fit)] == [0, 1]


def test_the_outcomes_hold_every_prompt_and_sample_with_the_prompts_hash(fit):
    outcomes = read_outcomes(outcome_files(fit)[-1])
    assert outcomes.prompt.tolist() == list(range(NUM_VAL))
    assert outcomes.correct.shape == outcomes.reward.shape == (NUM_VAL, SAMPLES)
    prompts = fit.datamodule.val_dataset["prompt"]
    assert outcomes.prompt_hash.tolist() == [prompt_hash(prompt) for prompt in prompts]


def test_the_outcomes_give_the_logged_accuracy_reward_and_pass_at_k(fit):
    """By hand from the last validation's rows: accuracy is the mean score, pass@2 of 2 samples the
    share of prompts with a correct one; the accuracy function is the only reward, so they agree."""
    outcomes, metrics = read_outcomes(outcome_files(fit)[-1]), fit.trainer.callback_metrics
    assert set(np.unique(outcomes.correct)) <= {0.0, 1.0}
    np.testing.assert_array_equal(outcomes.reward, outcomes.correct)
    assert float(metrics["val/accuracy"]) == pytest.approx(outcomes.correct.mean())
    assert float(metrics["val/reward"]) == pytest.approx(outcomes.reward.mean())
    assert float(metrics["val/pass@2"]) == pytest.approx(outcomes.correct.max(axis=1).mean())


def test_pass_at_k_samples_beside_greedy_validation(tiny_model_dir, tmp_path, one_torch_thread):
    """``evaluation.pass_at_k_samples 3``: val/accuracy is the greedy completions' (their file
    ``val-step``, one sample), pass@k and maj@3 those of 3 sampled ones (``val-sampled-step``, by hand)."""
    scorer = f"{__name__}.odd_length"
    cli = GRPOLightningCLI(
        args=[
            "validate",
            "--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml"),
            "--config", str(CONFIGS / "variant/grpo.yaml"), "--config", str(CONFIGS / "model/tiny.yaml"),
            "--model.model", tiny_model_dir, "--model.rewards.funcs", f"[{scorer}]",
            "--model.evaluation.accuracy_func", scorer, "--model.evaluation.pass_at_k_samples", "3",
            "--model.evaluation.max_new_tokens", "4", "--data.num_train", "4", "--data.num_val", str(NUM_VAL),
            "--data.val_batch_size", "3", "--trainer.enable_progress_bar", "false",
            "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path),
        ]
    )  # fmt: skip
    folder = Path(cli.trainer.log_dir) / OUTCOMES_FOLDER
    assert sorted(path.name for path in folder.iterdir()) == ["val-sampled-step000000.csv.gz", "val-step000000.csv.gz"]
    greedy, sampled = read_outcomes(folder / "val-step000000.csv.gz"), read_outcomes(folder / "val-sampled-step000000.csv.gz")
    assert greedy.correct.shape == (NUM_VAL, 1) and sampled.correct.shape == (NUM_VAL, 3)
    metrics = cli.trainer.callback_metrics
    assert float(metrics["val/accuracy"]) == pytest.approx(greedy.correct.mean())
    assert float(metrics["val/pass@1"]) == pytest.approx(sampled.correct.mean())
    assert float(metrics["val/pass@3"]) == pytest.approx(sampled.correct.max(axis=1).mean())
    assert "val/maj@3" in metrics

    # evaluation_sampling's block: every metric from its own 4 completions, none from a draw of pass_at_k_samples
    (folder / "val-sampled-step000000.csv.gz").unlink()
    with cli.model.evaluation_sampling(4, temperature=1.0):
        cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
    assert sorted(path.name for path in folder.iterdir()) == ["val-step000000.csv.gz"]
    four = read_outcomes(folder / "val-step000000.csv.gz")
    assert four.correct.shape == (NUM_VAL, 4)
    metrics = cli.trainer.callback_metrics
    assert float(metrics["val/accuracy"]) == pytest.approx(four.correct.mean())
    assert float(metrics["val/pass@1"]) == pytest.approx(four.correct.mean())
    assert float(metrics["val/pass@4"]) == pytest.approx(four.correct.max(axis=1).mean())
    assert cli.model.pass_at_k_samples == 3  # restored after the block


def test_pass_at_k_samples_need_one_validation_sample_and_at_least_two():
    from grpo_lightning.errors import ConfigError
    from grpo_lightning.training.options import EvaluationOptions

    with pytest.raises(ConfigError, match="evaluation.pass_at_k_samples: 4 needs evaluation.samples 1"):
        EvaluationOptions(samples=2, temperature=1.0, pass_at_k_samples=4).check()
    with pytest.raises(ConfigError, match="evaluation.pass_at_k_samples: 1 needs"):
        EvaluationOptions(pass_at_k_samples=1).check()
