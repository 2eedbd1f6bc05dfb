"""Specification of Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement
Learning for Reasoning Language Models").

Hook values are worked out by hand in the comments next to them; the gradient tests run the real
modules on a tiny random model (``tests/conftest.py``).
"""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch.testing import assert_close

from grpo_lightning.data import ArithmeticDataModule
from grpo_lightning.errors import ConfigError
from variants.clip_cov import ClipCov
from variants.covariance import clip_cov_tokens, selection_size, token_covariance
from variants.kl_cov import KLCov

f64 = torch.float64


def t(values, dtype=f64):
    return torch.tensor(values, dtype=dtype)


# ------------------------------------------------------------------ defaults and settings


def test_defaults_follow_the_paper():
    clip_cov = ClipCov(model="unused")
    # Cui et al. 2025 and the authors' scripts: r = 2e-4 in [1, 5]; k = 2e-3 (Qwen2.5-7B), beta_KL = 1.
    assert (clip_cov.clip_cov_ratio, clip_cov.clip_cov_lb, clip_cov.clip_cov_ub) == (2e-4, 1.0, 5.0)
    kl_cov = KLCov(model="unused")
    assert (kl_cov.kl_cov_ratio, kl_cov.kl_coef) == (2e-3, 1.0)
    for module in (clip_cov, kl_cov):
        assert module.beta == 0.0  # no KL to a reference model: nothing extra is loaded
        assert (module.clip_eps_low, module.clip_eps_high) == (0.2, 0.2)
        assert module.kl_placement == "loss"
    # GRPO's advantages: group 0 has spread (see tests/algorithms/test_variants.py), group 1 none.
    z = 1.2245948897605123
    assert_close(clip_cov.advantages(t([[3.0, 1.0, 2.0, 2.0], [0.5] * 4])), t([[z, -z, 0.0, 0.0], [0.0] * 4]))


@pytest.mark.parametrize(
    "cls, kwargs, field",
    [
        (ClipCov, {"clip_cov_ratio": 0.0}, "clip_cov_ratio"),
        (ClipCov, {"clip_cov_ratio": 1.5}, "clip_cov_ratio"),
        (ClipCov, {"clip_cov_lb": 5.0, "clip_cov_ub": 5.0}, "clip_cov_lb, clip_cov_ub"),
        (ClipCov, {"clip_cov_lb": 6.0}, "clip_cov_lb, clip_cov_ub"),
        (KLCov, {"kl_cov_ratio": 0.0}, "kl_cov_ratio"),
        (KLCov, {"kl_coef": -0.1}, "kl_coef"),
    ],
)
def test_invalid_settings_are_refused_naming_the_field(cls, kwargs, field):
    with pytest.raises(ConfigError, match=rf"^{field}: .*the paper"):
        cls(model="unused", **kwargs)


# ------------------------------------------------------------------ hand-computed values

# Two rows, 3 and 2 valid tokens (N = 5); advantages +1 (row 0) and -1 (row 1).
LOGP = [[-1.0, -2.0, -3.0, -9.0], [-0.5, -3.5, -9.0, -9.0]]
MASK = [[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
ADV = [1.0, -1.0]
# mean A = (3 - 2) / 5 = 0.2: centred A is 0.8 on row 0, -1.2 on row 1.
# mean logp = (-1 - 2 - 3 - 0.5 - 3.5) / 5 = -2: centred logp [1, 0, -1 | 1.5, -1.5].
# Cov = [0.8, 0, -0.8 | -1.8, 1.8]; padding 0.
COV = [[0.8, 0.0, -0.8, 0.0], [-1.8, 1.8, 0.0, 0.0]]
# old_logp = logp - 0.1 everywhere: rho = exp(0.1) on every token, inside [0.8, 1.2].
RHO = math.exp(0.1)  # 1.1051709180756477


def test_token_covariance_by_hand():
    assert_close(token_covariance(t(LOGP), t(ADV), t(MASK)), t(COV))


def test_selection_size_is_the_floor_of_the_share_but_at_least_one():
    assert selection_size(0.4, t(MASK)) == 2  # floor(0.4 * 5)
    assert selection_size(2e-4, t(MASK)) == 1  # floor(0.001) = 0, raised to 1
    assert selection_size(0.5, torch.zeros(2, 4)) == 0  # no valid token


def test_kl_cov_penalises_the_top_tokens_by_hand():
    module = KLCov(model="unused", kl_cov_ratio=0.4)  # 2 of 5 tokens: Cov 1.8 (row 1, t1) and 0.8 (row 0, t0)
    logp = t(LOGP).requires_grad_()
    loss = module.token_loss(logp, t(LOGP) - 0.1, t(ADV), t(MASK))
    # -A rho everywhere (clip inactive); + |logp - old| = 0.1 on the two chosen tokens.
    r = RHO
    expected = [[-r + 0.1, -r, -r, -r], [r, r + 0.1, r, r]]
    assert_close(loss.detach(), t(expected))
    total = module.aggregate(loss, t(MASK))
    # token mean: (-3r + 2r + 0.2) / 5 = (0.2 - r) / 5 = -0.18103418361512954
    assert_close(total.detach(), t(-0.18103418361512954))
    (grad,) = torch.autograd.grad(total, logp)
    # d/dlogp: (-A rho + sign(logp - old) * [chosen]) / 5; 0 on padding.
    g = 0.22103418361512954  # rho / 5
    assert_close(grad, t([[-g + 0.2, -g, -g, 0.0], [g, g + 0.2, 0.0, 0.0]]))
    assert module.step_metrics.compute_and_reset()["kl_cov/penalised_frac"] == pytest.approx(0.4)


def test_kl_cov_penalty_has_no_gradient_on_policy():
    module = KLCov(model="unused", kl_cov_ratio=0.4)
    logp = t(LOGP).requires_grad_()
    loss = module.token_loss(logp, logp.detach(), t(ADV), t(MASK))
    (grad,) = torch.autograd.grad(module.aggregate(loss, t(MASK)), logp)
    # rho = 1, |logp - old| = 0 and its gradient is 0: -A / 5 only.
    assert_close(grad, t([[-0.2, -0.2, -0.2, 0.0], [0.2, 0.2, 0.0, 0.0]]))


def test_clip_cov_detaches_the_tokens_in_range_by_hand():
    # [1, 2] holds one token (Cov 1.8, row 1, t1); the budget floor(0.4 * 5) = 2 is capped at 1.
    module = ClipCov(model="unused", clip_cov_ratio=0.4, clip_cov_lb=1.0, clip_cov_ub=2.0)
    logp = t(LOGP).requires_grad_()
    loss = module.token_loss(logp, t(LOGP) - 0.1, t(ADV), t(MASK))
    r = RHO
    assert_close(loss.detach(), t([[-r, -r, -r, -r], [r, r, r, r]]))  # the value is kept
    total = module.aggregate(loss, t(MASK))
    assert_close(total.detach(), t(-0.22103418361512954))  # (-3r + 2r) / 5
    (grad,) = torch.autograd.grad(total, logp)
    g = 0.22103418361512954  # rho / 5
    assert_close(grad, t([[-g, -g, -g, 0.0], [g, 0.0, 0.0, 0.0]]))  # no gradient on the detached token
    assert module.step_metrics.compute_and_reset()["clip_cov/detached_frac"] == pytest.approx(0.2)


def test_clip_cov_leaves_out_tokens_the_ppo_clip_already_stops():
    # [0.5, 2] holds Cov 0.8 (row 0, t0) and 1.8 (row 1, t1); budget floor(0.2 * 5) = 1.
    # Row 1, t1 has rho = exp(-0.5) = 0.61 < 0.8 with A = -1: clipped, so row 0, t0 is the one, whatever the seed.
    old = t(LOGP) - 0.1
    old[1, 1] = LOGP[1][1] + 0.5
    for seed in range(5):
        module = ClipCov(model="unused", clip_cov_ratio=0.2, clip_cov_lb=0.5, clip_cov_ub=2.0, clip_cov_seed=seed)
        chosen = module.choose_tokens(t(LOGP), old, t(ADV), t(MASK))
        assert chosen.tolist() == [[True, False, False, False], [False, False, False, False]]


def test_clip_cov_draws_uniformly_among_the_candidates_and_reproducibly():
    cov = torch.arange(100, dtype=f64).view(1, 100) / 10  # 0.0, 0.1, ..., 9.9
    mask = torch.ones(1, 100)
    in_range = (cov >= 1.0) & (cov <= 5.0)
    assert int(in_range.sum()) == 41  # 1.0, 1.1, ..., 5.0

    def draw(seed):
        return clip_cov_tokens(cov, mask, 0.1, 1.0, 5.0, torch.Generator().manual_seed(seed))

    first = draw(0)
    assert int(first.sum()) == 10  # floor(0.1 * 100)
    assert not (first & ~in_range).any()
    assert torch.equal(draw(0), first)
    assert not torch.equal(draw(1), first)
    # Over many draws every candidate is picked, about 10 / 41 of the time.
    counts = sum(draw(seed).double() for seed in range(400))
    assert counts[~in_range].sum() == 0
    assert counts[in_range].min() > 0.1 * 400 and counts[in_range].max() < 0.4 * 400


def test_clip_cov_seed_and_step_set_the_draw():
    logp = torch.randn(4, 50, generator=torch.Generator().manual_seed(0), dtype=f64)
    advantages, mask = t([2.0, 1.0, -1.0, -2.0]), torch.ones(4, 50)
    kwargs = {"clip_cov_ratio": 0.05, "clip_cov_lb": -100.0, "clip_cov_ub": 100.0}
    chosen = [ClipCov(model="unused", clip_cov_seed=s, **kwargs).choose_tokens(logp, logp, advantages, mask) for s in (0, 0, 1)]
    assert int(chosen[0].sum()) == 10
    assert torch.equal(chosen[0], chosen[1]) and not torch.equal(chosen[0], chosen[2])


# ------------------------------------------------------------------ micro-batch invariance

PROMPTS = ["12+34=", "5+6=", "77+8=", "9*9="]  # x group_size 4 = 16 rows


def _perturb(model: torch.nn.Module, scale: float = 0.05) -> None:
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator, dtype=p.dtype))


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
    _perturb(module.policy)  # a policy that moved since the rollout: KL-Cov's penalty has a gradient
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


class GradientCapture(L.Callback):
    def __init__(self) -> None:
        self.gradients: list[dict[str, torch.Tensor]] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.gradients.append({n: p.grad.detach().clone() for n, p in pl_module.policy.named_parameters()})


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
