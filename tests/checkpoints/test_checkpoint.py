"""Checkpoints: a fit stopped at step k and resumed from its checkpoint logs, for steps k+1..n,
exactly what one uninterrupted fit to n logs; bad checkpoint paths fail naming the path; the
trained policy exports as a plain Hugging Face directory."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_lightning.cli.app import main
from grpo_lightning.checkpoints.export import export_checkpoint, read_checkpoint
from grpo_lightning.checkpoints.export import main as export_main
from grpo_lightning.training.callbacks import ValidateBeforeTraining
from grpo_lightning.variants import DAPO
from tests.helpers import CONFIGS, assert_same_steps, fit, fit_stopped_and_resumed, logits, make_module


class SaveWhileSampling(L.Callback):
    """At the first batch after step ``after`` that ends with groups in DAPO's dynamic-sampling
    buffer (no update yet), save a checkpoint and stop."""

    def __init__(self, after: int, path: Path) -> None:
        self.after, self.path, self.saved_at = after, path, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.saved_at is None and trainer.global_step >= self.after and pl_module.buffer.num_groups:
            trainer.save_checkpoint(self.path)
            self.saved_at = trainer.global_step
            trainer.should_stop = True


@pytest.mark.parametrize("stop", [3, 4], ids=["mid-epoch", "end-of-epoch"])
def test_grpo_resumed_from_a_checkpoint_logs_what_an_uninterrupted_fit_logs(tiny_model_dir, tmp_path, stop):
    total = 6
    full, path, resumed, trainer = fit_stopped_and_resumed(lambda: make_module(tiny_model_dir, kl={"beta": 0.04}), total,
                                                           stop, tmp_path)  # fmt: skip
    assert sorted(full) == list(range(1, total + 1))
    checkpoint = read_checkpoint(path)
    assert not any(k.startswith("ref_model.") for k in checkpoint["state_dict"])
    assert {"rng", "generated_tokens", "step_metrics"} <= set(checkpoint["training_state"][0])
    position = checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert (position["epoch"], position["batches"]) == (0, stop)

    assert trainer.global_step == total
    assert_same_steps(resumed, full, stop + 1, total)


class FinalWeights(L.Callback):
    """The policy's weights and the module's rollout count when training ends."""

    def on_train_end(self, trainer, pl_module) -> None:
        self.weights = {name: value.clone() for name, value in pl_module.policy.state_dict().items()}
        self.rollouts = pl_module.rollouts


#: Validation every 2 optimizer steps, one batch of completions sampled at temperature 1.
VALIDATE_EVERY_2 = dict(limit_val_batches=1, val_check_interval=2, check_val_every_n_epoch=None)


def sampled_validation(model_dir: str):
    return make_module(model_dir, evaluation={"temperature": 1.0})


def without_validation(steps: dict) -> dict:
    return {step: {k: v for k, v in metrics.items() if not k.startswith("val/") and k != "step"}
            for step, metrics in steps.items()}  # fmt: skip


def test_a_resume_from_a_checkpoint_of_a_step_that_validated_is_exact(tiny_model_dir, tmp_path):
    """ModelCheckpoint saves at step 2 before that step's validation, which the resumed fit does not run."""
    ends: list[FinalWeights] = []  # of the uninterrupted, the stopped and the resumed fit

    def final_weights() -> list[FinalWeights]:
        ends.append(FinalWeights())
        return ends[-1:]

    total, stop = 4, 2
    full, _, resumed, _ = fit_stopped_and_resumed(lambda: sampled_validation(tiny_model_dir), total, stop, tmp_path,
                                                  callbacks=final_weights, **VALIDATE_EVERY_2)  # fmt: skip
    assert any(k.startswith("val/") for k in full[total])  # it validated at step 2 (and the step is logged before 4's)
    assert_same_steps(without_validation(resumed), without_validation(full), stop + 1, total)
    uninterrupted, _, again = ends
    torch.testing.assert_close(again.weights, uninterrupted.weights, rtol=0, atol=0)
    assert again.rollouts == uninterrupted.rollouts == total


def test_validation_leaves_training_as_it_would_be_without_it(tiny_model_dir, tmp_path):
    """Before the first step, every 2 steps and at the end, validation draws from the generators and
    counts its rollouts; training samples as the fit without validation does."""
    validated, plain = FinalWeights(), FinalWeights()
    fit(sampled_validation(tiny_model_dir), 4, tmp_path / "validated", callbacks=[validated, ValidateBeforeTraining()],
        **VALIDATE_EVERY_2)  # fmt: skip
    fit(sampled_validation(tiny_model_dir), 4, tmp_path / "plain", callbacks=[plain])
    torch.testing.assert_close(validated.weights, plain.weights, rtol=0, atol=0)
    assert validated.rollouts == plain.rollouts == 4


def test_dapo_resumed_while_its_dynamic_sampling_buffer_holds_groups(tiny_model_dir, tmp_path):
    """The checkpoint is taken between two generation batches of one update: the kept groups,
    the generation-batch count and the step's partial metrics all carry over."""
    total = 6
    settings = dict(cls=DAPO, dynamic_sampling=True, max_gen_batches=3, on_exhausted="partial")
    full, _ = fit(make_module(tiny_model_dir, **settings), total, tmp_path / "full")
    assert any(values["dynamic_sampling/gen_batches"] > 1 for values in full.values())

    save = SaveWhileSampling(after=2, path=tmp_path / "sampling.ckpt")
    fit(make_module(tiny_model_dir, **settings), total, tmp_path / "first", callbacks=[save])
    assert save.saved_at is not None, "no generation batch left groups in the buffer: change the reward or seed"
    buffer = read_checkpoint(save.path)["training_state"][0]["buffers"]["buffer"]
    assert buffer["kept"] and buffer["gen_batches"] >= 1

    resumed, trainer = fit(make_module(tiny_model_dir, **settings), total, tmp_path / "resumed", ckpt_path=save.path)
    assert trainer.global_step == total
    assert_same_steps(resumed, full, save.saved_at + 1, total)


# ---------------------------------------------------------------- bad checkpoint paths


def cli_fit(model_dir: str, ckpt_path: Path) -> None:
    main([
        "fit", "--config", str(CONFIGS / "trainer/cpu.yaml"), "--config", str(CONFIGS / "data/arithmetic.yaml"),
        "--config", str(CONFIGS / "variant/grpo.yaml"), "--model.model", model_dir, "--ckpt_path", str(ckpt_path),
    ])  # fmt: skip


def test_a_missing_checkpoint_fails_naming_the_path(tiny_model_dir, tmp_path):
    missing = tmp_path / "no" / "such.ckpt"
    with pytest.raises(FileNotFoundError, match="no/such.ckpt.*does not exist"):
        cli_fit(tiny_model_dir, missing)


def test_a_truncated_checkpoint_fails_naming_the_path(tiny_model_dir, tmp_path):
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{step}", every_n_train_steps=1)
    fit(make_module(tiny_model_dir), 1, tmp_path / "first", callbacks=[every])
    whole = (tmp_path / "ckpt" / "step=1.ckpt").read_bytes()
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match="truncated.ckpt.*truncated or corrupt"):
        cli_fit(tiny_model_dir, truncated)
    with pytest.raises(ValueError, match="truncated.ckpt"):
        export_checkpoint(truncated, tmp_path / "out")


# ---------------------------------------------------------------- export


def test_the_trained_policy_exports_as_a_hugging_face_directory(tiny_model_dir, tmp_path):
    grpo = make_module(tiny_model_dir, optim={"learning_rate": 1e-2})
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{step}", every_n_train_steps=2)
    fit(grpo, 2, tmp_path / "fit", callbacks=[every])
    grpo.policy.eval()
    trained = logits(grpo.policy, grpo.tokenizer)
    initial = logits(AutoModelForCausalLM.from_pretrained(tiny_model_dir), grpo.tokenizer)
    assert not torch.equal(trained, initial)

    grpo.save_pretrained(tmp_path / "saved")
    export_main(["--ckpt_path", str(tmp_path / "ckpt" / "step=2.ckpt"), "--output_dir", str(tmp_path / "exported")])
    for directory in ("saved", "exported"):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / directory)
        tokenizer = AutoTokenizer.from_pretrained(tmp_path / directory)
        assert tokenizer.get_vocab() == grpo.tokenizer.get_vocab()
        torch.testing.assert_close(logits(model, tokenizer), trained, rtol=0, atol=0)
