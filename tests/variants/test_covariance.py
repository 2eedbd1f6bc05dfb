"""What Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
Reasoning Language Models") share (variants/covariance.py): their defaults, the token covariance and
the selection size by hand, and a choice made once per minibatch, so that the gradient does not
depend on micro-batching. Each preset's own cases are tests/variants/test_clip_cov.py and
tests/variants/test_kl_cov.py.

The gradient tests run the real modules on a tiny random model (``tests/conftest.py``).
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.testing import assert_close

from grpo_lightning.data import ArithmeticDataModule
from grpo_lightning.variants.kl_cov import KLCov
from grpo_lightning.variants.clip_cov import ClipCov
from grpo_lightning.variants.covariance import selection_size, token_covariance
from tests.helpers import COV, COV_ADV, COV_LOGP, COV_MASK, GradientCapture, perturb, t


# ------------------------------------------------------------------ defaults


def test_defaults_follow_the_paper():
    clip_cov = ClipCov(model="unused")
    # Cui et al. 2025 and the authors' scripts: r = 2e-4 in [1, 5]; k = 2e-3 (Qwen2.5-7B), beta_KL = 1.
    assert (clip_cov.clip_cov_ratio, clip_cov.clip_cov_lb, clip_cov.clip_cov_ub) == (2e-4, 1.0, 5.0)
    kl_cov = KLCov(model="unused")
    assert (kl_cov.kl_cov_ratio, kl_cov.kl_coef) == (2e-3, 1.0)
    for module in (clip_cov, kl_cov):
        assert module.coefficients.beta == 0.0  # no KL to a reference model: nothing extra is loaded
        assert (module.settings.clip_eps_low, module.settings.clip_eps_high) == (0.2, 0.2)
        assert module.settings.kl_placement == "loss"
    # GRPO's advantages: group 0 has spread (see tests/helpers.py), group 1 none.
    z = 1.2245948897605123
    assert_close(clip_cov.advantages(t([[3.0, 1.0, 2.0, 2.0], [0.5] * 4])), t([[z, -z, 0.0, 0.0], [0.0] * 4]))


# ------------------------------------------------------------------ hand-computed values

# COV_LOGP, COV_MASK, COV_ADV and COV, and their hand-worked values, are in tests/helpers.py.


def test_token_covariance_by_hand():
    assert_close(token_covariance(t(COV_LOGP), t(COV_ADV), t(COV_MASK)), t(COV))


def test_selection_size_is_the_floor_of_the_share_but_at_least_one():
    assert selection_size(0.4, t(COV_MASK)) == 2  # floor(0.4 * 5)
    assert selection_size(2e-4, t(COV_MASK)) == 1  # floor(0.001) = 0, raised to 1
    assert selection_size(0.5, torch.zeros(2, 4)) == 0  # no valid token


# ------------------------------------------------------------------ micro-batch invariance

PROMPTS = ["12+34=", "5+6=", "77+8=", "9*9="]  # x group_size 4 = 16 rows


@pytest.mark.parametrize(
    "cls, kwargs",
    [
        pytest.param(ClipCov, {"clip_cov_ratio": 0.3, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9}, id="ClipCov"),
        pytest.param(KLCov, {"kl_cov_ratio": 0.3}, id="KLCov"),
    ],
)
def test_gradient_does_not_depend_on_micro_batching(cls, kwargs, make_module, make_rollout, one_torch_thread):
    module = make_module(cls, **kwargs)
    rollout = make_rollout(module, PROMPTS)
    rollout.old_logp = module.compute_logprobs(module.policy, rollout)
    perturb(module.policy)  # a policy that moved since the rollout: KL-Cov's penalty has a gradient
    n = len(rollout)
    advantages = module.advantages(rollout.rewards.view(-1, rollout.group_size)).flatten()
    assert advantages.abs().sum() > 0
    num_tokens = rollout.completion_mask.sum()

    def total_gradient(sizes: list[int], derived: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        module.policy.zero_grad(set_to_none=True)
        for rows in torch.arange(n).split(sizes):
            module.micro_batch_loss(rollout, advantages, rows, n, num_tokens, derived).backward()
        return {name: p.grad.clone() for name, p in module.policy.named_parameters()}

    derived = module.minibatch_derived(rollout, advantages, torch.arange(n))  # the choice, once for the minibatch
    whole = total_gradient([n], derived)
    split = total_gradient([3, 5, n - 8], derived)
    assert int(derived[module.CHOICE].sum()) == int(0.3 * num_tokens)
    for name in whole:
        assert_close(split[name], whole[name], rtol=1e-5, atol=1e-7, msg=lambda m, name=name: f"{name}: {m}")
    # Choosing per micro-batch instead (as the authors' code does) would change the gradient.
    per_micro_batch = total_gradient([3, 5, n - 8])
    assert any(not torch.allclose(per_micro_batch[name], whole[name], rtol=1e-5, atol=1e-7) for name in whole)


@pytest.mark.parametrize(
    "cls, kwargs",
    [
        pytest.param(ClipCov, {"clip_cov_ratio": 0.3, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9}, id="ClipCov"),
        pytest.param(KLCov, {"kl_cov_ratio": 0.3}, id="KLCov"),
    ],
)
def test_trainer_steps_do_not_depend_on_micro_batching(cls, kwargs, make_module, one_torch_thread):
    # 2 prompts x 4 completions = 8 rows in minibatches of 4 (two optimizer steps; the second is
    # off-policy, so KL-Cov's penalty has a gradient), micro-batches of 2 + 2 against one of 4.
    gradients = []
    for micro_batch_size in (2, 4):
        L.seed_everything(0)
        capture = GradientCapture()
        module = make_module(
            cls, configure=False, **kwargs, optim={"micro_batch_size": micro_batch_size, "minibatch_size": 4}
        )
        trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, max_steps=2,
                            num_sanity_val_steps=0, limit_val_batches=0, callbacks=[capture])  # fmt: skip
        datamodule = ArithmeticDataModule(num_train=64, num_val=0, val_split=None, batch_size=2)
        trainer.fit(module, datamodule=datamodule)
        assert len(capture.gradients) == 2
        gradients.append(capture.gradients)
    for split, whole in zip(*gradients):
        assert sum(g.abs().sum() for g in whole.values()) > 0
        for name in whole:
            assert_close(split[name], whole[name], rtol=1e-5, atol=1e-7, msg=lambda m, name=name: f"{name}: {m}")
