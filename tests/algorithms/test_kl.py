"""Where the KL goes (``grpo_lightning.algorithms.kl``): the two placements by hand, and
``kl.placement`` on a variant: its default, the estimator it picks, what it refuses."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from grpo_lightning import variants
from grpo_lightning.algorithms import functional as F
from grpo_lightning.algorithms.kl import KL_PLACEMENTS, kl_in_loss, kl_in_reward
from grpo_lightning.cli.parsing import option_choices
from grpo_lightning.errors import ConfigError
from grpo_lightning.training.options import KLOptions
from tests.helpers import hand_rollout


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_the_reward_side_penalty_is_beta_times_the_kl_summed_over_the_completions_tokens():
    kl = t([[0.5, -1.0, 0.25], [0.5, 0.5, 7.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])  # row 1's third token is padding: its 7.0 counts for nothing
    # sums: 0.5 - 1 + 0.25 = -0.25; 0.5 + 0.5 = 1.0. beta 0.1: penalties -0.025, 0.1.
    shaped, penalty = kl_in_reward(t([1.0, 2.0]), kl, mask, beta=0.1)
    assert_close(penalty, t([-0.025, 0.1]))
    assert_close(shaped, t([1.025, 1.9]))


def test_the_reward_side_penalty_of_a_completion_without_tokens_is_zero():
    shaped, penalty = kl_in_reward(t([3.0]), t([[float("nan"), 2.0]]), t([[0, 0]]), beta=0.5)
    assert_close(shaped, t([3.0]))
    assert_close(penalty, t([0.0]))


def test_the_loss_side_term_adds_beta_times_the_kl_at_every_token_with_its_gradient():
    kl = t([[0.5, 2.0]]).requires_grad_()
    loss = kl_in_loss(t([[1.0, -1.0]]), kl, beta=0.25)
    assert_close(loss.detach(), t([[1.125, -0.5]]))
    loss.sum().backward()
    assert_close(kl.grad, t([[0.25, 0.25]]))


def test_the_placements_by_name_are_the_registrys_and_another_name_is_refused_naming_them():
    assert option_choices("model.init_args.kl.placement") == list(KL_PLACEMENTS) == ["loss", "reward"]
    with pytest.raises(ConfigError, match=r"^kl.placement: 'sideways' is not one of loss, reward;"):
        variants.GRPO("m", kl={"placement": "sideways"})


def test_each_variant_declares_where_its_kl_goes_and_the_option_moves_it():
    in_reward = {"RLOO", "ReinforcePlusPlus", "PPO"}
    for name in variants.__all__:
        cls = getattr(variants, name)
        assert cls.default_kl_placement == ("reward" if name in in_reward else "loss"), name
    grpo = variants.GRPO("m", kl={"placement": "reward"})
    assert (grpo.settings.kl_placement, grpo.settings.kl_estimator) == ("reward", "k1")  # k1 in the reward, as the papers
    rloo = variants.RLOO("m", kl={"placement": "loss"})
    assert (rloo.settings.kl_placement, rloo.settings.kl_estimator) == ("loss", "k3")
    assert variants.GRPO("m", kl={"placement": "reward", "estimator": "k3"}).settings.kl_estimator == "k3"


def test_a_placement_with_beta_zero_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"^kl.placement: .*beta = 0"):
        variants.DAPO("m", kl={"placement": "reward"})  # DAPO: beta 0
    with pytest.raises(ConfigError, match=r"^kl.placement: .*beta = 0"):
        KLOptions(beta=0.0, placement="loss")


def test_a_placement_the_loop_cannot_run_is_refused_naming_it():
    refusal = r"^kl.placement: ProcessGRPO cannot put the KL in the reward .*--model.kl.placement loss"
    with pytest.raises(ConfigError, match=refusal):
        variants.ProcessGRPO("m", kl={"beta": 0.1, "placement": "reward"})
    assert variants.ProcessGRPO("m", kl={"beta": 0.1, "placement": "loss"}).settings.kl_placement == "loss"


def test_unbiased_kl_is_refused_where_the_kl_is_in_the_reward_by_option_too():
    with pytest.raises(ConfigError, match=r"^kl.unbiased: does not apply to GRPO .its KL term is in the reward"):
        variants.GRPO("m", kl={"placement": "reward", "unbiased": True})


def test_grpo_with_the_kl_in_the_reward_subtracts_beta_times_the_summed_k1():
    module = variants.GRPO(model="unused", kl={"beta": 0.1, "placement": "reward"})
    rollout = hand_rollout([3, 2], width=3, group_size=2)
    rollout.old_logp = t([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    rollout.ref_logp = t([[-1.5, -1.0, -3.0], [-1.0, -1.0, 0.0]])
    # k1 = old - ref: row 0 0.5 - 1 + 0 = -0.5; row 1 0.5 + 0.5 (third token masked) = 1.0. beta 0.1:
    assert_close(module.shape_rewards(t([1.0, 2.0]), rollout), t([1.05, 1.9]))
    assert module.step_metrics.compute_and_reset()["kl_penalty"] == pytest.approx((-0.05 + 0.1) / 2)
    in_loss = variants.GRPO(model="unused", kl={"beta": 0.1})
    assert_close(in_loss.shape_rewards(t([1.0, 2.0]), rollout), t([1.0, 2.0]))


def test_grpo_with_the_kl_in_the_reward_has_no_kl_term_in_its_loss(make_module, make_rollout, one_torch_thread):
    in_reward = make_module(variants.GRPO, kl={"beta": 0.1, "placement": "reward"})
    in_loss = make_module(variants.GRPO, kl={"beta": 0.1})
    rollout = make_rollout(in_reward, ["1+1=", "2+3="])
    logp = in_reward.compute_logprobs(in_reward.policy, rollout)
    rollout.ref_logp = logp - 0.3 * torch.arange(logp.size(1), dtype=logp.dtype)  # a KL that is not 0
    advantages = torch.linspace(-1, 1, len(rollout))
    rows, mask = torch.arange(len(rollout)), rollout.completion_mask
    losses = [module.micro_batch_loss(rollout, advantages, rows, len(rows), mask.sum()).detach()
              for module in (in_reward, in_loss)]  # fmt: skip
    k3 = F.kl_estimate(logp, rollout.ref_logp, "k3")
    assert_close(losses[1] - losses[0], in_loss.aggregate(0.1 * k3, mask))
