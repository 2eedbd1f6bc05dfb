"""The base module's ablation options (loss.delta, rewards.scale, rewards.aggregation,
loss.top_entropy_quantile, loss.mask_truncated_completions, kl.unbiased): hand-computed values, the module wiring, micro-batch
invariance, and the error for an option a variant leaves no place for."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from grpo_lightning.algorithms import functional as F
from grpo_lightning.algorithms import policy_losses
from grpo_lightning import variants
from grpo_lightning.errors import ConfigError
from grpo_lightning.variants import DAPO, GRPO, GSPO, RLOO, DrGRPO
from tests.helpers import grouped, micro_batched_gradient

PROMPTS = ["12+34=", "5+6=", "77+8=", "9*9="]  # x group_size 4 = 16 rows


# ------------------------------------------------------------------ delta (two-sided clipping)


def test_delta_caps_the_ratio_of_negative_advantage_tokens():
    logp = torch.tensor([[math.log(3.0), math.log(3.0), math.log(1.5)]], requires_grad=True)
    old = torch.zeros(1, 3)
    advantages = torch.tensor([[-1.0, 1.0, -1.0]])
    plain, _, _ = policy_losses.clipped_surrogate(logp, old, advantages, 0.2, 0.2)
    capped, _, _ = policy_losses.clipped_surrogate(logp, old, advantages, 0.2, 0.2, delta=2.0)
    # A < 0, ratio 3: -min(3 * -1, 1.2 * -1) = 3, capped: -min(2 * -1, 1.2 * -1) = 2.
    # A > 0, ratio 3: the upper clip binds, 1.2 either way. A < 0, ratio 1.5 < delta: unchanged.
    assert_close(plain, torch.tensor([[3.0, -1.2, 1.5]]))
    assert_close(capped, torch.tensor([[2.0, -1.2, 1.5]]))
    (grad,) = torch.autograd.grad(capped.sum(), logp)
    # d/dlogp of -ratio * A is -A * ratio where the ratio is not capped; 0 where delta or the clip binds.
    assert_close(grad, torch.tensor([[0.0, 0.0, 1.5]]))


def test_delta_must_exceed_the_upper_clip_bound():
    with pytest.raises(ValueError, match="delta must exceed 1 \\+ eps_high"):
        policy_losses.clipped_surrogate(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), 0.2, 0.28, delta=1.2)
    with pytest.raises(ConfigError, match="^loss.delta: must exceed 1 \\+ clip_eps_high = 1.28"):
        DAPO("x", loss={"delta": 1.25})


def test_the_base_token_loss_passes_delta_on(make_module):
    module = make_module(GRPO, configure=False, loss={"delta": 2.0})
    logp = torch.tensor([[math.log(3.0)]])
    loss = module.token_loss(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    assert_close(loss, torch.tensor([[2.0]]))


# ------------------------------------------------------------------ scale_rewards


REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])


@pytest.mark.parametrize(
    ("scale", "divisor"),
    [
        ("group", math.sqrt(1 / 3) + 1e-4),  # unbiased std of (1, 0, 0, 1)
        ("batch", math.sqrt(1.5 / 7) + 1e-4),  # unbiased std of all eight rewards (mean 0.75)
        ("none", 1.0),
    ],
)
def test_scale_rewards_picks_the_divisor(scale, divisor):
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]) / divisor
    assert_close(F.group_normalized_advantages(REWARDS, scale=scale), expected)


def test_grpo_family_advantages_follow_scale_rewards(make_module):
    module = make_module(DAPO, configure=False, rewards={"scale": "none"})
    assert_close(module.advantages(REWARDS), torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0] * 4]))


# ------------------------------------------------------------------ reward_aggregation


def test_normalize_then_sum_normalises_each_function_within_its_group():
    nan = float("nan")
    per_function = torch.tensor([[1.0, 0.0], [0.0, 10.0], [5.0, 2.0], [5.0, nan]])
    weights = torch.tensor([1.0, 0.5])
    z1 = 0.5 / (math.sqrt(0.5) + 1e-4)  # function 1, group 1: (1, 0), std sqrt(0.5)
    z2 = 5.0 / (math.sqrt(50.0) + 1e-4)  # function 2, group 1: (0, 10), std sqrt(50)
    # Group 2: function 1 is constant (0); function 2 has one valid score (0), the NaN is skipped.
    expected = torch.tensor([z1 - 0.5 * z2, -z1 + 0.5 * z2, 0.0, 0.0])
    assert_close(F.group_normalized_reward_sum(per_function, weights, group_size=2), expected)


def test_the_training_step_hands_normalised_sums_to_the_advantages(make_module, make_rollout, monkeypatch):
    def constant(prompts, completions, **kwargs):
        return [float(len(c) % 3) * 10 for c in completions]

    module = make_module(
        GRPO,
        rewards={"aggregation": "normalize_then_sum", "funcs": ["tests.helpers.length_parity_reward", constant]},
        kl={"beta": 0.0},
    )
    seen = {}
    monkeypatch.setattr(module, "advantages", lambda rewards, rollout: seen.setdefault("rewards", rewards) * 0)
    monkeypatch.setattr(module, "update", lambda rollout, advantages, num_groups: None)
    monkeypatch.setattr(module, "log_step", lambda: None)
    rollout = make_rollout(module, PROMPTS)
    monkeypatch.setattr(module, "generate", lambda batch, group_size, sampling, with_logprobs=False: rollout)
    module.training_step({"prompt": PROMPTS}, 0)
    expected = F.group_normalized_reward_sum(rollout.reward_per_function, module.reward_weights, rollout.group_size)
    assert_close(seen["rewards"].flatten(), expected)


# ------------------------------------------------------------------ top_entropy_quantile


def test_top_entropy_mask_keeps_the_highest_entropy_tokens():
    entropy = torch.tensor([[0.1, 0.5, 0.9, 0.3], [0.7, 0.2, 9.0, 0.4]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 1]])
    # The seven valid entropies sorted: .1 .2 .3 .4 .5 .7 .9; the 0.6 quantile is .4 + 0.6 * (.5 - .4) = .46.
    assert F.top_entropy_mask(entropy, mask, 0.4).tolist() == [[0, 1, 1, 0], [1, 0, 0, 0]]
    assert F.top_entropy_mask(entropy, mask, 1.0) is mask


def test_top_entropy_quantile_zeroes_the_loss_of_low_entropy_tokens(make_module, make_rollout):
    module = make_module(GRPO, kl={"beta": 0.0}, loss={"top_entropy_quantile": 0.5})
    rollout = make_rollout(module, PROMPTS)
    advantages = torch.ones(len(rollout))
    rows = torch.arange(len(rollout))
    logp, entropy = module._forward(module.policy, rollout, rows)
    kept = F.top_entropy_mask(entropy, rollout.completion_mask, 0.5)
    expected = F.sequence_mean_token_mean(-torch.ones_like(logp) * kept, rollout.completion_mask)
    loss = module.micro_batch_loss(rollout, advantages, rows, len(rollout), rollout.completion_mask.sum())
    assert 0 < kept.sum() < rollout.completion_mask.sum()
    assert_close(loss, expected)


# ------------------------------------------------------------------ mask_truncated_completions


def test_truncated_completions_carry_no_loss(make_module, make_rollout):
    module = make_module(DAPO, dynamic_sampling=False, overlong_buffer=0, loss={"mask_truncated_completions": True})
    rollout = make_rollout(module, PROMPTS)
    truncated = rollout.truncated
    assert truncated.any() and not truncated.all(), "the tiny model should truncate some completions"
    rows = torch.arange(len(rollout))
    mask = module.loss_mask(rollout, rows)
    assert mask[truncated].sum() == 0
    assert torch.equal(mask[~truncated], rollout.completion_mask[~truncated])
    # Token mean over the kept tokens only: -A on each, so -1 with advantages of 1.
    loss = module.micro_batch_loss(rollout, torch.ones(len(rollout)), rows, len(rollout), mask.sum())
    assert_close(loss, torch.tensor(-1.0))


# ------------------------------------------------------------------ unbiased_kl


def test_unbiased_kl_weights_the_k3_estimate_by_the_ratio(make_module, make_rollout):
    module = make_module(GRPO, kl={"beta": 0.5, "unbiased": True})
    rollout = make_rollout(module, PROMPTS)
    rows = torch.arange(len(rollout))
    with torch.no_grad():
        for p in module.ref_model.parameters():
            p.mul_(0.9)
    rollout.ref_logp = module.compute_logprobs(module.ref_model, rollout)
    rollout.old_logp = module.compute_logprobs(module.policy, rollout) - 0.1  # ratio exp(0.1) on every token
    advantages = torch.zeros(len(rollout))
    loss = module.micro_batch_loss(rollout, advantages, rows, len(rollout), rollout.completion_mask.sum())
    logp = module.compute_logprobs(module.policy, rollout)
    k3 = F.kl_k3(logp, rollout.ref_logp)
    expected = F.sequence_mean_token_mean(0.5 * k3 * math.exp(0.1), rollout.completion_mask)
    assert_close(loss, expected, rtol=1e-5, atol=1e-6)


def test_unbiased_kl_needs_a_kl_term():
    with pytest.raises(ConfigError, match="^kl.unbiased: .*beta = 0"):
        GRPO("x", kl={"beta": 0.0, "unbiased": True})


# ------------------------------------------------------------------ where an option has no place


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (DrGRPO, {"rewards": {"scale": "batch"}}, "rewards.scale: does not apply to DrGRPO"),
        (RLOO, {"rewards": {"scale": "none"}}, "rewards.scale: does not apply to RLOO"),
        (RLOO, {"kl": {"unbiased": True}}, "kl.unbiased: does not apply to RLOO .its KL term is in the reward"),
        (GSPO, {"loss": {"delta": 2.0}}, "loss.delta: does not apply to GSPO"),
    ],
)
def test_an_inapplicable_option_names_the_option_and_the_variant(cls, kwargs, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        cls("x", **kwargs)


def test_rloo_with_its_kl_in_the_loss_takes_unbiased_kl():
    assert RLOO("x", kl={"placement": "loss", "unbiased": True}).hparams.kl["unbiased"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rewards.scale", "std", "rewards.scale: 'std' is not one of group, batch, none"),
        ("rewards.aggregation", "mean", "rewards.aggregation: 'mean' is not one of sum_then_normalize, normalize_then_sum"),
        ("loss.top_entropy_quantile", 0.0, "loss.top_entropy_quantile: must be in \\(0, 1\\]"),
    ],
)
def test_bad_option_values_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        GRPO("x", **grouped({field: value}))


# ------------------------------------------------------------------ micro-batch invariance


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        pytest.param(GRPO, {"kl": {"beta": 0.04, "unbiased": True}, "loss": {"delta": 2.0}, "rewards": {"scale": "batch"}},
                     id="GRPO"),
        pytest.param(DAPO, {"dynamic_sampling": False, "loss": {"mask_truncated_completions": True}}, id="DAPO-masked"),
        pytest.param(GRPO, {"kl": {"beta": 0.0}, "loss": {"mask_truncated_completions": True}}, id="GRPO-masked"),
        pytest.param(GRPO, {"sampling": {"correction": "sequence_truncate", "correction_cap": 1.05}}, id="GRPO-IS"),
        pytest.param(DAPO, {"dynamic_sampling": False, "sampling": {"correction": "token_mask"}}, id="DAPO-IS"),
    ],
)
def test_the_options_keep_the_gradient_independent_of_micro_batching(cls, kwargs, make_module, make_rollout):
    module = make_module(cls, **kwargs)
    rollout = make_rollout(module, PROMPTS)
    n = len(rollout)
    if module.settings.rollout_correction.mode:  # an engine that disagrees with the training pass by up to 0.2 nats
        noise = 0.2 * (torch.rand(rollout.completion_mask.shape, generator=torch.Generator().manual_seed(0)) - 0.5)
        rollout.sampling_logp = (module.compute_logprobs(module.policy, rollout) + noise) * rollout.completion_mask
    if module.coefficients.beta > 0:
        with torch.no_grad():
            for p in module.ref_model.parameters():
                p.mul_(0.95)
        rollout.ref_logp = module.compute_logprobs(module.ref_model, rollout)
    advantages = module.advantages(rollout.rewards.view(-1, rollout.group_size)).flatten()
    num_tokens = module.loss_mask(rollout, torch.arange(n)).sum()

    whole = micro_batched_gradient(module, rollout, advantages, [n], num_tokens)
    split = micro_batched_gradient(module, rollout, advantages, [3, 5, n - 8], num_tokens)
    assert sum(g.abs().sum() for g in whole.values()) > 0
    for name in whole:
        assert_close(split[name], whole[name], rtol=1e-5, atol=1e-7, msg=lambda m: f"{name}: {m}")


# ------------------------------------------------------------------ every option with every variant


ALL_VARIANTS = [getattr(variants, name) for name in variants.__all__]
#: The parts by name (advantage, aggregation) are tried on every variant in tests/conformance/.
OPTION_VALUES = {
    "loss.delta": 2.0,
    "rewards.scale": "batch",
    "rewards.aggregation": "normalize_then_sum",
    "loss.top_entropy_quantile": 0.5,
    "loss.mask_truncated_completions": True,
    "kl.unbiased": True,
}


@pytest.mark.parametrize("option", sorted(OPTION_VALUES))
@pytest.mark.parametrize("cls", ALL_VARIANTS, ids=lambda c: c.__name__)
def test_each_option_combines_with_each_variant_or_says_why_not(cls, option, make_module, make_rollout, one_torch_thread):
    kwargs = {option: OPTION_VALUES[option]}
    if option == "loss.delta" and cls.__name__ == "CISPO":
        kwargs["loss.clip_eps_high"] = 0.2  # CISPO's default upper bound 5.0 would need delta > 6
    if option == "kl.unbiased":
        kwargs["kl.beta"] = 0.04
    reasons = dict(cls.inapplicable_options)
    if option == "kl.unbiased" and cls.__name__ in ("RLOO", "ReinforcePlusPlus", "PPO"):
        reasons["kl.unbiased"] = "its KL term is in the reward"
    if option in reasons:
        with pytest.raises(ConfigError, match=f"^{option}: does not apply to {cls.__name__}"):
            cls("x", **grouped(kwargs))
        return
    if cls is DAPO:
        kwargs["dynamic_sampling"] = False
    if cls.__name__ == "OnPolicyDistillation":  # its teacher here is the policy itself: the reward carries the gradient
        kwargs["reward_weight"] = 1.0
    if cls.__name__ == "ProcessGRPO":  # the rollout has no answers: a step per token, alternating scores
        kwargs["step_reward_func"] = lambda prompts, completions, token_ends: [
            [(t, float(t % 2)) for t in range(len(ends))] for ends in token_ends
        ]
    module = make_module(cls, **grouped(kwargs))
    rollout = make_rollout(module, PROMPTS)
    n = len(rollout)
    rows = torch.arange(n)
    if module.coefficients.beta > 0:
        rollout.ref_logp = module.compute_logprobs(module.ref_model, rollout) - 0.05
        if module.settings.kl_placement == "reward":  # the KL of the reward is taken against the old policy
            rollout.old_logp = module.compute_logprobs(module.policy, rollout)
    rewards = module.shape_rewards(rollout.rewards, rollout)
    advantages = module.advantages(rewards.view(-1, rollout.group_size), rollout).flatten(0, 1)
    loss = module.micro_batch_loss(rollout, advantages, rows, n, module.loss_mask(rollout, rows).sum())
    loss.backward()
    assert torch.isfinite(loss)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.policy.parameters())
