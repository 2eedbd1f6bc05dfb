"""Specification of CISPO, SAPO, GMPO and REINFORCE++ (baseline form), as tests/algorithms/test_variants.py
does for the first five variants.

Hook values are worked out by hand in the comments next to them (``math.log`` / ``math.exp`` only
spell out a number). Their surrogates' own cases, their micro-batch invariance and their printed
configuration are the conformance suite's (tests/conformance/).
"""

from __future__ import annotations

import math
import time

import pytest
import torch
import transformers
from torch.testing import assert_close

from grpo_lightning.rollout.types import Rollout
from grpo_lightning.errors import ConfigError
from variants import CISPO, GMPO, SAPO, ReinforcePlusPlus

VARIANTS = [CISPO, SAPO, GMPO, ReinforcePlusPlus]
f64 = torch.float64


def t(values, dtype=f64):
    return torch.tensor(values, dtype=dtype)


def token_grad(loss: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """``d sum(loss) / d logp``: every entry of ``loss`` depends on ``logp`` only through its row."""
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    return grad


# ------------------------------------------------------------------ construction and defaults


@pytest.mark.parametrize("cls", VARIANTS, ids=lambda c: c.__name__)
def test_construction_loads_nothing_and_is_instant(cls, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the constructor must not load a model or tokenizer")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    start = time.perf_counter()
    module = cls(model="no-such/model", sampling={"group_size": 4, "max_new_tokens": 16})
    assert time.perf_counter() - start < 1.0
    assert module.policy is None and module.ref_model is None and module.tokenizer is None


@pytest.mark.parametrize(
    "cls, beta, eps_low, eps_high, placement",
    [
        (CISPO, 0.0, None, 5.0, "loss"),  # no lower bound on the IS weight; TRL's / ScaleRL's 5.0 above
        (SAPO, 0.0, 0.2, 0.2, "loss"),  # no clip at all: the base's range, which it refuses to change
        (GMPO, 0.0, 0.4, 0.4, "loss"),  # log-space clip, ratios within (e^-0.4, e^0.4)
        (ReinforcePlusPlus, 0.01, 0.2, 0.2, "reward"),  # PPO clip; k1 KL in the reward
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_defaults_follow_the_papers(cls, beta, eps_low, eps_high, placement):
    module = cls(model="unused")
    assert module.beta == beta
    assert (module.clip_eps_low, module.clip_eps_high) == (eps_low, eps_high)
    assert module.kl_placement == placement
    assert module.hparams["loss"]["clip_eps_low"] == eps_low  # what checkpoints and the CLI record


def test_sapo_temperatures_default_to_the_paper_and_must_be_positive():
    module = SAPO(model="unused")
    assert (module.tau_pos, module.tau_neg) == (1.0, 1.05)
    with pytest.raises(ConfigError, match="tau_pos"):
        SAPO(model="unused", tau_pos=0.0)
    with pytest.raises(ConfigError, match="tau_neg"):
        SAPO(model="unused", tau_neg=-1.0)


@pytest.mark.parametrize(("option", "value"), [("clip_eps_low", 0.3), ("clip_eps_high", 0.3), ("delta", 3.0), ("clip_ratio_c", 3.0)])
def test_sapo_refuses_a_clip_range_it_would_not_use(option, value):
    """Its gate has no clip: a clip setting on it would change nothing, so it is an error."""
    with pytest.raises(ConfigError, match=f"^loss.{option}: does not apply to SAPO \\(its soft gate replaces the ratio clip\\)"):
        SAPO(model="unused", loss={option: value})


def test_cispo_lower_bound_is_checked_by_the_base_when_given():
    assert CISPO(model="unused", loss={"clip_eps_low": 0.2}).clip_eps_low == 0.2
    with pytest.raises(ConfigError, match="clip_eps_low"):
        CISPO(model="unused", loss={"clip_eps_low": 1.5})


# ------------------------------------------------------------------ advantages

# Group 0 has spread, group 1 is all equal. GRPO's: mean 2, deviations [1, -1, 0, 0], unbiased
# std sqrt(2/3) = 0.816496580927726; 1 / (0.816496580927726 + 1e-4) = 1.2245948897605123.
REWARDS = [[3.0, 1.0, 2.0, 2.0], [0.5, 0.5, 0.5, 0.5]]
Z = 1.2245948897605123
# REINFORCE++: centred [1, -1, 0, 0 | 0, 0, 0, 0]; unbiased std over all 8: sqrt(2 / 7);
# 1 / sqrt(2/7) = sqrt(3.5) = 1.8708286933869707.
ADVANTAGES = {
    CISPO: [[Z, -Z, 0.0, 0.0], [0.0] * 4],
    SAPO: [[Z, -Z, 0.0, 0.0], [0.0] * 4],
    GMPO: [[Z, -Z, 0.0, 0.0], [0.0] * 4],
    ReinforcePlusPlus: [[1.8708286933869707, -1.8708286933869707, 0.0, 0.0], [0.0] * 4],
}


@pytest.mark.parametrize("cls", VARIANTS, ids=lambda c: c.__name__)
def test_advantages_by_hand(cls):
    advantages = cls(model="unused").advantages(t(REWARDS))
    assert_close(advantages, t(ADVANTAGES[cls]))
    assert torch.equal(advantages[1], torch.zeros(4, dtype=f64))


def test_reinforce_plus_plus_scales_by_the_batch_std_not_each_groups():
    # centred [0.5, -0.5 | 2, -2]; unbiased std over the batch: sqrt((0.25 + 0.25 + 4 + 4) / 3)
    # = sqrt(8.5 / 3) = 1.6832508230603465: 0.5 / it = 0.2970442628930023, 2 / it = 1.1881770515720091.
    # (Per-group scaling would give +-0.707 in both groups.)
    advantages = ReinforcePlusPlus(model="unused").advantages(t([[1.0, 0.0], [4.0, 0.0]]))
    assert_close(advantages, t([[0.2970442628930023, -0.2970442628930023], [1.1881770515720091, -1.1881770515720091]]))


def test_reinforce_plus_plus_all_equal_batch_is_all_zero():
    module = ReinforcePlusPlus(model="unused")
    for rewards in ([[1.0, 1.0], [2.0, 2.0]], [[3.0]]):  # std 0; a single entry (no unbiased std)
        advantages = module.advantages(t(rewards))
        assert torch.equal(advantages, torch.zeros_like(advantages))
        assert not advantages.isnan().any()


# ------------------------------------------------------------------ aggregation

# Ragged mask: row 0 has 3 tokens (sum 1+2+3 = 6), row 1 has 1 token (5).
LOSS = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]
MASK = [[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
AGGREGATES = {
    CISPO: 2.75,  # token mean over the batch: 11 / 4 tokens
    SAPO: 3.5,  # sequence mean of token means: (6/3 + 5/1) / 2
    GMPO: 3.5,  # same reduction: the mean over completions of a loss spread on every token
    ReinforcePlusPlus: 2.75,  # token mean over the batch
}


@pytest.mark.parametrize("cls", VARIANTS, ids=lambda c: c.__name__)
def test_aggregate_on_a_ragged_mask_by_hand(cls):
    module = cls(model="unused", sampling={"max_new_tokens": 4})
    assert_close(module.aggregate(t(LOSS), t(MASK)), t(AGGREGATES[cls]))
    # Whole-minibatch counts passed in: two halves add up to the whole.
    whole = module.aggregate(t(LOSS), t(MASK), num_sequences=2, num_tokens=t(4.0))
    halves = sum(module.aggregate(t([row]), t([m]), num_sequences=2, num_tokens=t(4.0)) for row, m in zip(LOSS, MASK))
    assert_close(halves, whole)


# ------------------------------------------------------------------ token losses


def _cispo_case():
    # Row 0, A = +1: r = 0.3 / 0.1 = 3 (inside [0, 6]) and r = 0.7 / 0.1 = 7 (above 1 + 5 = 6).
    # Row 1, A = -2: r = 0.01 / 0.5 = 0.02 (far below 1) and r = 1.
    logp = t([[math.log(0.3), math.log(0.7)], [math.log(0.01), math.log(0.25)]]).requires_grad_()
    old = t([[math.log(0.1), math.log(0.1)], [math.log(0.5), math.log(0.25)]])
    return logp, old, t([1.0, -2.0]), t([[1.0, 1.0], [1.0, 1.0]])


def test_cispo_with_a_lower_bound_clamps_the_weight_and_still_passes_the_gradient():
    module = CISPO(model="unused", loss={"clip_eps_low": 0.2})
    logp, old, advantages, mask = _cispo_case()
    loss = module.token_loss(logp, old, advantages, mask)
    # r = 0.02 -> w = 0.8: -0.8 * -2 * log 0.01 = -7.368272297580946, gradient -0.8 * -2 = 1.6.
    assert_close(loss.detach()[1, 0], t(-7.368272297580946))
    assert_close(token_grad(loss, logp), t([[-3.0, -6.0], [1.6, 2.0]]))
    assert module.step_metrics.compute_and_reset()["clip_ratio/low"] == pytest.approx(0.25)


@pytest.mark.parametrize("tau_pos, tau_neg", [(1.0, 1.05), (0.3, 7.0)])
def test_sapo_gradient_on_policy_is_minus_the_advantage(tau_pos, tau_neg):
    module = SAPO(model="unused", tau_pos=tau_pos, tau_neg=tau_neg)
    logp = t([[-0.7, -2.0], [-1.3, -0.1], [-0.4, -0.4]]).requires_grad_()
    advantages = t([1.5, -0.5, 0.0])
    loss = module.token_loss(logp, logp.detach(), advantages, torch.ones(3, 2, dtype=f64))
    assert_close(token_grad(loss, logp), t([[-1.5, -1.5], [0.5, 0.5], [0.0, 0.0]]))


def test_reinforce_plus_plus_keeps_the_ppo_clip():
    # Row 0: r = 1.25, A = +1: -min(1.25, 1.2) = -1.2, clipped; row 1: r = 0.75, A = -1: 0.8, clipped.
    module = ReinforcePlusPlus(model="unused")
    logp = t([[math.log(1.25)], [math.log(0.75)]]).requires_grad_()
    loss = module.token_loss(logp, torch.zeros_like(logp), t([1.0, -1.0]), t([[1.0], [1.0]]))
    assert_close(loss.detach(), t([[-1.2], [0.8]]))
    assert torch.equal(token_grad(loss, logp), torch.zeros_like(logp))


# ------------------------------------------------------------------ REINFORCE++ KL in the reward


def hand_rollout(lengths: list[int], width: int, group_size: int) -> Rollout:
    n = len(lengths)
    mask = (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()
    return Rollout(
        group_size=group_size,
        prompt_ids=torch.zeros(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=torch.zeros(n, width, dtype=torch.long),
        completion_mask=mask,
        truncated=torch.tensor([length >= width for length in lengths]),
        prompts=["p"] * n,
        completions=[""] * n,
    )


def test_reinforce_plus_plus_puts_the_summed_k1_kl_in_the_reward():
    rollout = hand_rollout([3, 2], width=3, group_size=2)
    rollout.old_logp = t([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    rollout.ref_logp = t([[-1.5, -1.0, -3.0], [-1.0, -1.0, 0.0]])
    # k1 = old - ref: row 0: 0.5 - 1 + 0 = -0.5; row 1: 0.5 + 0.5 (third token masked) = 1.0.
    # beta 0.01: [1 + 0.005, 2 - 0.01]
    assert_close(ReinforcePlusPlus(model="unused").shape_rewards(t([1.0, 2.0]), rollout), t([1.005, 1.99]))
    in_loss = ReinforcePlusPlus(model="unused", kl={"placement": "loss"})
    assert in_loss.kl_placement == "loss"
    assert_close(in_loss.shape_rewards(t([1.0, 2.0]), rollout), t([1.0, 2.0]))
    assert in_loss.kl_estimator == "k3"  # in the loss, the base's default


def test_reinforce_plus_plus_puts_the_chosen_kl_estimator_in_the_reward():
    rollout = hand_rollout([3, 2], width=3, group_size=2)
    rollout.old_logp = t([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    rollout.ref_logp = t([[-1.5, -1.0, -3.0], [-1.0, -1.0, 0.0]])
    # k2 = (ref - old)^2 / 2: row 0 (0.25 + 1 + 0) / 2 = 0.625; row 1 (0.25 + 0.25) / 2 = 0.25 (third token masked)
    shaped = ReinforcePlusPlus(model="unused", kl={"estimator": "k2"}).shape_rewards(t([1.0, 2.0]), rollout)
    assert_close(shaped, t([1.0 - 0.01 * 0.625, 2.0 - 0.01 * 0.25]))
