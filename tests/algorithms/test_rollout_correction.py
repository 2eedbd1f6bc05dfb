"""Rollout/training mismatch: both engines record the sampled tokens' log-probs as the training
pass computes them, the mismatch metrics and the importance-sampling corrections by hand values,
and a real fit logging them."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch

from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.rollout.types import SamplingParams
from grpo_lightning.algorithms.rollout_correction import correction_weights, importance_ratio, mismatch_metrics
from grpo_lightning.training.settings import ConfigError
from tests.conftest import length_parity_reward
from variants import GRPO

TRAIN = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.4, 0.4, 0.1]]))
# Rollout probabilities: ratios rho = train / rollout of [[0.5, 3, 1], [1, 0.8, 1 (masked)]].
SAMPLING = torch.log(torch.tensor([[1.0, 0.1, 0.2], [0.4, 0.5, 0.9]]))
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def close(got: torch.Tensor, expected: list) -> None:
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-6, rtol=1e-6)


def test_token_and_sequence_ratios_by_hand():
    close(importance_ratio(TRAIN, SAMPLING, MASK, "token"), [[0.5, 3.0, 1.0], [1.0, 0.8, 1.0]])
    # sequence: the product over a completion's tokens, 0.5 * 3 * 1 = 1.5 and 1 * 0.8 = 0.8
    close(importance_ratio(TRAIN, SAMPLING, MASK, "sequence"), [[1.5, 1.5, 1.5], [0.8, 0.8, 1.0]])


@pytest.mark.parametrize(
    ("mode", "cap", "expected"),
    [
        ("token_truncate", 2.0, [[0.5, 2.0, 1.0], [1.0, 0.8, 1.0]]),
        ("token_mask", 2.0, [[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]),
        ("sequence_truncate", 1.2, [[1.2, 1.2, 1.2], [0.8, 0.8, 1.0]]),
        ("sequence_mask", 1.2, [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]),
    ],
)
def test_correction_weights_by_hand(mode, cap, expected):
    close(correction_weights(TRAIN, SAMPLING, MASK, mode, cap), expected)


def test_mismatch_metrics_by_hand():
    metrics = {name: value.item() for name, (value, _) in mismatch_metrics(TRAIN, SAMPLING, MASK).items()}
    gaps = [math.log(2), math.log(3), 0.0, 0.0, abs(math.log(0.8))]
    assert metrics["sampling/sampling_logp_difference/mean"] == pytest.approx(sum(gaps) / 5)
    assert metrics["sampling/sampling_logp_difference/max"] == pytest.approx(math.log(3))
    assert metrics["sampling/importance_sampling_ratio/min"] == pytest.approx(0.5)
    assert metrics["sampling/importance_sampling_ratio/mean"] == pytest.approx((0.5 + 3 + 1 + 1 + 0.8) / 5)
    assert metrics["sampling/importance_sampling_ratio/max"] == pytest.approx(3.0)


def test_bad_settings_name_the_field(tiny_model_dir):
    with pytest.raises(ConfigError, match="sampling.correction: 'tis' is not one of token_truncate"):
        GRPO(model=tiny_model_dir, sampling={"correction": "tis"})
    with pytest.raises(ConfigError, match="sampling.correction_cap: must be >= 1"):
        GRPO(model=tiny_model_dir, sampling={"correction_cap": 0.5})


@pytest.mark.parametrize("rollout", ["hf", "static"])
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_engines_record_the_log_probs_the_training_pass_computes(make_module, rollout, temperature, top_p):
    # fp32 on a CPU: the engines and the training pass agree to rounding. Top-p changes what is
    # drawn, not the recorded distribution (softmax(logits / T), as the training pass computes it).
    grpo = make_module(
        GRPO, engine=EngineOptions(rollout=rollout), policy={"dtype": "float32"}, sampling={"max_new_tokens": 6}
    )
    grpo.sampling = SamplingParams(max_new_tokens=6, temperature=temperature, top_p=top_p)
    torch.manual_seed(0)
    rollout_ = grpo.generate({"prompt": ["1+2=", "30+4=", "7="]}, 3, grpo.sampling, with_logprobs=True)
    assert rollout_.sampling_logp is not None and rollout_.sampling_logp.shape == rollout_.completion_ids.shape
    train = grpo.compute_logprobs(grpo.policy, rollout_)
    mask = rollout_.completion_mask.bool()
    assert torch.allclose(rollout_.sampling_logp[mask], train[mask], atol=1e-4)
    assert (rollout_.sampling_logp[~mask] == 0).all()


@pytest.mark.parametrize("correction", [None, "token_truncate", "sequence_mask"])
def test_a_fit_logs_the_mismatch_and_trains_with_each_correction(make_module, tmp_path, correction, one_torch_thread):
    grpo = make_module(
        GRPO,
        configure=False,
        sampling={"correction": correction},
        rewards={"funcs": [length_parity_reward]},
        kl={"beta": 0.0},
        optim={"learning_rate": 1e-3},
    )
    from grpo_lightning.data import ArithmeticDataModule

    trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        limit_val_batches=0, default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(grpo, datamodule=ArithmeticDataModule(batch_size=2, num_train=16, num_val=4))
    metrics = grpo.last_step_metrics
    assert metrics["sampling/importance_sampling_ratio/min"] <= 1.0 + 1e-4 <= metrics["sampling/importance_sampling_ratio/max"] + 2e-4
    assert 0.0 <= metrics["sampling/sampling_logp_difference/mean"] < 1e-3  # one engine, fp32: rounding only
    assert math.isfinite(metrics["loss"])
