"""The registered per-token surrogates (:data:`grpo_lightning.algorithms.SURROGATES`) beyond their
hand-computed cases (tests/conformance/): the dual clip, the shares they return apart from the loss,
and ``--model.loss.surrogate`` on the variants (what composes, and what is refused)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from grpo_lightning import variants
from grpo_lightning.algorithms import SURROGATES
from grpo_lightning.algorithms.surrogates import dual_clip, ppo_clip
from grpo_lightning.errors import ConfigError

PROMPTS = ["12+34=", "5+6=", "77+8="]  # x group_size 4 = 12 rows


def test_the_presets_name_their_papers_surrogate():
    assert [getattr(variants, name).default_surrogate for name in ("GRPO", "GSPO", "CISPO", "SAPO", "GMPO")] == [
        "ppo_clip", "gspo", "cispo", "sapo", "gmpo"
    ]  # fmt: skip


# ------------------------------------------------------------------ by hand


def test_dual_clip_bounds_a_negative_advantage_tokens_loss_by_c_times_its_advantage():
    logp = torch.tensor([[math.log(5.0), math.log(2.0), math.log(5.0)]], requires_grad=True)
    old, advantages = torch.zeros(1, 3), torch.tensor([[-1.0, -1.0, 1.0]])
    loss, shares = ppo_clip(logp, old, advantages, torch.ones(1, 3), clip_ratio_c=3.0)
    # A < 0, r = 5: PPO's loss max(5, 0.8) * 1 = 5, bounded by -c A = 3. r = 2: 2 < 3, unchanged.
    # A > 0, r = 5: the upper clip binds, -1.2; the dual clip never acts where A > 0.
    assert_close(loss, torch.tensor([[3.0, 2.0, -1.2]]))
    assert shares["clip_ratio/dual"].tolist() == [[True, False, False]]
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    assert_close(grad, torch.tensor([[0.0, 2.0, 0.0]]))  # -A r where nothing binds, 0 where a bound does


def test_dual_clip_equals_delta_above_the_upper_bound_and_refuses_c_at_most_1():
    logp, old = torch.randn(4, 6), torch.randn(4, 6)
    advantages = torch.tensor([-1.0, 0.5, -2.0, 1.0])
    dual, _ = ppo_clip(logp, old, advantages, None, clip_ratio_c=2.0)
    delta, _ = ppo_clip(logp, old, advantages, None, delta=2.0)
    assert_close(dual, delta)
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        dual_clip(torch.zeros(1, 1), torch.ones(1, 1), 1.0)


def test_ppo_clip_returns_its_clip_shares_apart_from_the_loss():
    logp = torch.log(torch.tensor([[0.5, 1.0, 1.5]]))
    _, shares = ppo_clip(logp, torch.zeros(1, 3), torch.tensor([[-1.0, 1.0, 1.0]]), None)
    assert shares["clip_ratio/low"].tolist() == [[True, False, False]]
    assert shares["clip_ratio/high"].tolist() == [[False, False, True]]
    assert shares["clip_ratio/region"].tolist() == [[True, False, True]]


def test_the_surrogate_options_are_read_from_the_function_signatures():
    assert SURROGATES["ppo_clip"].options() == ("clip_eps_low", "clip_eps_high", "delta", "clip_ratio_c")
    assert SURROGATES["sapo"].options() == ("tau_pos", "tau_neg")
    assert SURROGATES["gspo"].unused_clip_options() == dict.fromkeys(
        ("loss.delta", "loss.clip_ratio_c"), SURROGATES["gspo"].unclipped
    )


# ------------------------------------------------------------------ on the module


def off_policy(module, rollout):
    """Old log-probs away from the policy's, so that every ratio, clip, gate and mask acts."""
    logp = module.compute_logprobs(module.policy, rollout)
    rollout.old_logp = logp + 0.3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(1))
    return rollout


def update_loss(module, rollout) -> float:
    n, rows = len(rollout), torch.arange(len(rollout))
    advantages = module.advantages(rollout.rewards.view(-1, rollout.group_size)).flatten()
    return module.micro_batch_loss(rollout, advantages, rows, n, module.loss_mask(rollout, rows).sum()).item()


def test_grpo_with_gspos_surrogate_and_clip_range_is_gspo(make_module, make_rollout, one_torch_thread):
    composed = make_module(
        variants.GRPO, kl={"beta": 0.0}, loss={"surrogate": "gspo", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4}
    )
    rollout = off_policy(composed, make_rollout(composed, PROMPTS))
    assert update_loss(composed, rollout) == update_loss(make_module(variants.GSPO), rollout)
    assert update_loss(composed, rollout) != update_loss(make_module(variants.GRPO, kl={"beta": 0.0}), rollout)


def test_the_surrogate_logs_its_shares_and_sapos_gate_logs_none(make_module, make_rollout, one_torch_thread):
    grpo = make_module(variants.GRPO, kl={"beta": 0.0}, loss={"clip_ratio_c": 3.0})
    rollout = off_policy(grpo, make_rollout(grpo, PROMPTS))
    update_loss(grpo, rollout)
    logged = grpo.step_metrics.compute_and_reset()
    assert {"clip_ratio/low", "clip_ratio/high", "clip_ratio/region", "clip_ratio/dual"} <= set(logged)
    sapo = make_module(variants.SAPO)
    update_loss(sapo, rollout)
    assert not any(name.startswith("clip_ratio/") for name in sapo.step_metrics.compute_and_reset())


# ------------------------------------------------------------------ what composes and what is refused


def test_a_per_sequence_surrogate_is_refused_where_advantages_are_per_token():
    for name in ("PPO", "ProcessGRPO"):
        with pytest.raises(ConfigError, match=f"^loss.surrogate: gspo needs one advantage per completion, and {name}'s"):
            getattr(variants, name)("unused", loss={"surrogate": "gspo"})
    assert variants.PPO("unused", loss={"surrogate": "cispo"}).settings.surrogate == "cispo"


def test_an_unknown_surrogate_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match=f"^loss.surrogate: 'nope' is not one of {', '.join(SURROGATES)};"):
        variants.GRPO("unused", loss={"surrogate": "nope"})


def test_clip_options_follow_the_surrogate_of_the_run():
    with pytest.raises(ConfigError, match="^loss.delta: does not apply to GRPO \\(with the surrogate sapo, its soft gate"):
        variants.GRPO("unused", loss={"surrogate": "sapo", "delta": 2.0})
    with pytest.raises(ConfigError, match="^loss.clip_eps_high: does not apply to SAPO \\(its soft gate"):
        variants.SAPO("unused", loss={"clip_eps_high": 0.28})
    assert variants.SAPO("unused", loss={"surrogate": "ppo_clip", "clip_eps_high": 0.28}).settings.clip_eps_high == 0.28
    # GSPO's own clip range is its default, not a setting: another surrogate does not refuse it.
    assert variants.GSPO("unused", loss={"surrogate": "sapo"}).settings.surrogate == "sapo"
    with pytest.raises(ConfigError, match="^loss.surrogate: does not apply to ClipCov"):
        variants.ClipCov("unused", loss={"surrogate": "cispo"})


def test_clip_ratio_c_must_exceed_1_and_not_be_set_with_delta():
    with pytest.raises(ConfigError, match="^loss.clip_ratio_c: the dual-clip bound must be > 1"):
        variants.GRPO("unused", loss={"clip_ratio_c": 1.0})
    with pytest.raises(ConfigError, match="^loss.clip_ratio_c: bounds the same negative-advantage loss as loss.delta"):
        variants.GRPO("unused", loss={"clip_ratio_c": 3.0, "delta": 3.0})
    with pytest.raises(ConfigError, match="^loss.clip_ratio_c: does not apply to GSPO"):
        variants.GSPO("unused", loss={"clip_ratio_c": 3.0})
