"""The loss options any preset takes: the off-policy sequence mask (OPSM), the entropy bonus and its
adaptive coefficient, and the dual clip: values by hand, what they refuse, and their micro-batch
invariance together."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from grpo_lightning import variants
from grpo_lightning.algorithms.entropy import AdaptiveEntropy, entropy_bonus
from grpo_lightning.algorithms.masks import off_policy_sequence_mask
from grpo_lightning.errors import ConfigError
from tests.helpers import micro_batched_gradient

PROMPTS = ["12+34=", "5+6=", "77+8="]  # x group_size 4 = 12 rows


# ------------------------------------------------------------------ OPSM and the entropy bonus


def test_opsm_drops_only_negative_advantage_completions_that_drifted_past_the_threshold():
    old = torch.zeros(3, 2)
    logp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-0.1, -0.1]])  # mean log(pi_old / pi): 1, 1, 0.1
    kept = off_policy_sequence_mask(logp, old, torch.tensor([1.0, -1.0, -1.0]), torch.ones(3, 2), threshold=0.5)
    assert kept.tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]


def test_the_entropy_bonus_gradient_is_minus_the_entropy_gradient_in_expectation():
    logits = torch.tensor([0.3, -1.0, 2.0, 0.5], requires_grad=True)
    log_pi = torch.log_softmax(logits, dim=0)
    expected = (log_pi.exp().detach() * entropy_bonus(log_pi, log_pi.detach())).sum()  # E_{y ~ pi} of the term
    (grad,) = torch.autograd.grad(expected, logits, retain_graph=True)
    (entropy_grad,) = torch.autograd.grad(-(log_pi.exp() * log_pi).sum(), logits)
    assert_close(grad, -entropy_grad)


def test_adaptive_entropy_steps_the_coefficient_toward_the_target_once_per_step_and_resumes():
    module = variants.GRPO("unused", loss={"entropy_coef": 0.01})
    control = AdaptiveEntropy(target=0.2, delta=0.005, min_coef=0.0, max_coef=0.012)
    control.on_train_start(None, module)
    steps = [(1, 0.1), (1, 0.1), (2, 0.1), (3, 0.5), (4, 0.5), (5, 0.5)]  # (logged steps, entropy) after each batch
    seen = []
    for logged, entropy in steps:
        module.logged_steps, module.last_step_metrics = logged, {"entropy": entropy}
        control.on_train_batch_end(None, module, None, None, 0)
        seen.append(round(module.coefficients.entropy_coef, 6))
    # below the target: +0.005 (capped at 0.012), once per logged step; above it: -0.005, down to 0.
    assert seen == [0.012, 0.012, 0.012, 0.007, 0.002, 0.0]
    resumed, fresh = AdaptiveEntropy(), variants.GRPO("unused", loss={"entropy_coef": 0.01})
    resumed.load_state_dict(control.state_dict())
    resumed.on_train_start(None, fresh)
    assert fresh.coefficients.entropy_coef == 0.0 and resumed.seen == 5


def test_adaptive_entropy_is_a_trainer_callback_on_the_command_line():
    from grpo_lightning.cli.app import GRPOLightningCLI
    from grpo_lightning.cli.resources import config_dir

    configs = config_dir()
    args = ["--config", str(configs / "trainer/cpu.yaml"), "--config", str(configs / "data/arithmetic.yaml"),
            "--model", "GRPO", "--model.model", "m", "--trainer.callbacks+=grpo_lightning.algorithms.entropy.AdaptiveEntropy",
            "--trainer.callbacks.target", "0.3"]  # fmt: skip
    trainer = GRPOLightningCLI(args=args, run=False).trainer
    (control,) = [c for c in trainer.callbacks if isinstance(c, AdaptiveEntropy)]
    assert control.target == 0.3
    with pytest.raises(ConfigError, match="^AdaptiveEntropy: needs target >= 0, delta > 0"):
        AdaptiveEntropy(delta=0.0)


def test_opsm_and_entropy_coef_refuse_invalid_values():
    with pytest.raises(ConfigError, match="^loss.off_policy_mask_threshold: must be >= 0"):
        variants.GRPO("unused", loss={"off_policy_mask_threshold": -0.1})
    with pytest.raises(ConfigError, match="^loss.entropy_coef: must be a finite number >= 0"):
        variants.GRPO("unused", loss={"entropy_coef": -1e-3})


# ------------------------------------------------------------------ micro-batch invariance


def off_policy_gradients(module, rollout, sizes):
    n = len(rollout)
    advantages = module.advantages(rollout.rewards.view(-1, rollout.group_size)).flatten()
    return micro_batched_gradient(module, rollout, advantages, sizes, module.loss_mask(rollout, torch.arange(n)).sum())


def test_opsm_the_entropy_bonus_and_the_dual_clip_give_the_same_gradient_in_any_micro_batches(
    make_module, make_rollout, one_torch_thread
):
    """The presets are registered parts, each checked alone (tests/algorithms/test_surrogates.py, tests/algorithms/test_algorithm_parts.py);
    the options added to the surrogate are checked here, together."""
    name = "GRPO"
    kwargs = {
        "loss": {"off_policy_mask_threshold": 0.05, "entropy_coef": 0.01, "clip_ratio_c": 1.5},
        "kl": {"beta": 0.0},
    }
    module = make_module(getattr(variants, name), **kwargs)
    rollout = make_rollout(module, PROMPTS)
    logp = module.compute_logprobs(module.policy, rollout)
    rollout.old_logp = logp + 0.3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(1))
    whole = off_policy_gradients(module, rollout, [len(rollout)])
    split = off_policy_gradients(module, rollout, [5, 4, 3])
    assert any(g.abs().sum() > 0 for g in whole.values())
    for key in whole:
        assert_close(split[key], whole[key], rtol=1e-5, atol=1e-7, msg=lambda m: f"{name}, {key}: {m}")
