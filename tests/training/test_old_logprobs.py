"""The update's old log-probs (``sampling.old_logprobs``): ``bypass`` takes the sampler's and skips
the old-policy pass, ``loglinear`` interpolates by policy version (AReaL), ``recompute`` is the
pass; each by hand on the surrogate's ratio, and the passes a fit makes counted."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch

from grpo_lightning.data import ArithmeticDataModule
from grpo_lightning.errors import ConfigError
from grpo_lightning.variants import GRPO

SHIFT = 0.1  # the sampler's log-probs sit this far below the policy's: its ratio is exp(0.1) under bypass


def module_and_rollout(make_module, source):
    module = make_module(GRPO, policy={"dtype": "float32"}, sampling={"old_logprobs": source}, kl={"beta": 0.0},
                         optim={"ppo_epochs": 2, "micro_batch_size": 4})  # fmt: skip
    torch.manual_seed(0)
    rollout = module.generate({"prompt": ["1+2=", "3+4="]}, module.settings.group_size, module.sampling, with_logprobs=True)
    rollout.sampling_logp = (module.compute_logprobs(module.policy, rollout) - SHIFT) * rollout.completion_mask
    return module, rollout


def first_step_loss(module, rollout) -> torch.Tensor:
    module.compute_old_logprobs(rollout)
    advantages = torch.tensor([1.0, 0.5, 2.0, 1.5] * 2)
    rows = torch.arange(len(rollout))
    tokens = module.loss_mask(rollout, rows).sum()
    return module.micro_batch_loss(rollout, advantages, rows, len(rows), tokens).detach()


def test_bypass_clips_against_the_sampler_and_loglinear_interpolates_by_version(make_module):
    module, rollout = module_and_rollout(make_module, "recompute")
    recomputed = first_step_loss(module, rollout)  # old = current: every ratio 1
    assert recomputed.abs() > 1e-4
    module, rollout = module_and_rollout(make_module, "bypass")
    # old = sampler's = current - 0.1: ratio exp(0.1), inside the clip [0.8, 1.2], scales every token's loss
    torch.testing.assert_close(first_step_loss(module, rollout), recomputed * math.exp(SHIFT))
    module, rollout = module_and_rollout(make_module, "loglinear")
    torch.testing.assert_close(first_step_loss(module, rollout), recomputed)  # the update's first step: alpha = 1
    # sampled at version 0, the update started at 1, the weights now at 2: alpha = 1/2, ratio exp(0.05)
    module.policy_version = 1
    module.compute_old_logprobs(rollout)
    rollout.sampling_version = torch.zeros_like(rollout.sampling_version)
    module.policy_version = 2
    advantages, rows = torch.tensor([1.0, 0.5, 2.0, 1.5] * 2), torch.arange(len(rollout))
    loss = module.micro_batch_loss(rollout, advantages, rows, len(rows), module.loss_mask(rollout, rows).sum())
    torch.testing.assert_close(loss.detach(), recomputed * math.exp(SHIFT / 2))


@pytest.mark.parametrize("source", ["recompute", "bypass", "loglinear"])
def test_bypass_and_loglinear_make_one_forward_pass_fewer(make_module, tmp_path, source, one_torch_thread):
    module = make_module(GRPO, configure=False, policy={"dtype": "float32"}, sampling={"old_logprobs": source},
                         kl={"beta": 0.0}, optim={"ppo_epochs": 2, "micro_batch_size": 4})  # fmt: skip
    passes = {"no_grad": 0, "grad": 0}
    forward = module._forward

    def counted(*args, **kwargs):
        passes["grad" if torch.is_grad_enabled() else "no_grad"] += 1
        return forward(*args, **kwargs)

    module._forward = counted
    trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        limit_val_batches=0, default_root_dir=tmp_path, accelerator="cpu")  # fmt: skip
    trainer.fit(module, datamodule=ArithmeticDataModule(batch_size=2, num_train=8, num_val=4))
    assert trainer.global_step == 2  # one rollout of 8 completions, two epochs of one step
    assert passes["grad"] == 2 * 2  # two epochs of two micro-batches of 4
    assert passes["no_grad"] == (2 if source == "recompute" else 0)  # the old-policy pass: two micro-batches
    assert math.isfinite(module.last_step_metrics["loss"])


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"old_logprobs": "rollout"}, "^sampling.old_logprobs: 'rollout' is not one of recompute, bypass, loglinear"),
        ({"old_logprobs": "bypass", "mode": "beam_search"}, "^sampling.old_logprobs: bypass reads the sampler's"),
        ({"old_logprobs": "loglinear", "correction": "m2po"}, "^sampling.correction: m2po masks from old log-probs"),
    ],
)
def test_bad_old_logprobs_name_the_field_and_the_fix(tiny_model_dir, sampling, message):
    with pytest.raises(ConfigError, match=message):
        GRPO(model=tiny_model_dir, sampling=sampling)
