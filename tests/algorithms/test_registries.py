"""The registries of parts (:mod:`grpo_lightning.algorithms.parts`): the decorators that register a
part, an option's name or import path resolved to a registered part, and the step dispatching through
them (the advantage's form for ``rewards.scale``, what a ``kl.placement`` does to the loss)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from torch.testing import assert_close

from grpo_lightning import variants
from grpo_lightning.algorithms import ADVANTAGES, KL_PLACEMENTS, KLPlacement, register_advantage
from grpo_lightning.algorithms import functional as F
from grpo_lightning.algorithms.kl import kl_in_loss
from grpo_lightning.algorithms.parts import Registry
from grpo_lightning.errors import ConfigError

REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]])


def double(rewards):
    return 2 * rewards


def registry() -> Registry:
    return Registry("advantage", "a function rewards [P, G] -> advantages [P, G]")


def test_a_decorator_registers_under_the_name_given_or_the_functions_own_and_returns_it():
    parts = registry()
    assert parts.decorator("twice")(double) is double and parts.decorator(None)(torch.neg) is torch.neg
    assert parts == {"twice": double, "neg": torch.neg}


def test_registering_again_is_a_no_op_and_another_part_under_a_taken_name_is_refused():
    parts = registry()
    parts.register("twice", double)
    parts.register("twice", double)  # the module imported twice
    with pytest.raises(ValueError, match="^advantage: 'twice' is registered already"):
        parts.register("twice", torch.neg)
    with pytest.raises(ValueError, match="^advantage: 3 is not a function"):
        parts.register("three", 3)


def test_an_import_path_to_a_function_registers_it_under_the_path():
    parts = registry()
    assert parts.resolve("torch.neg") == "torch.neg" and parts["torch.neg"] is torch.neg
    parts.register("negated", torch.abs)
    assert parts.resolve("torch.abs") == "negated"  # registered already: its registered name
    assert parts.resolve(None) is None and parts.resolve("negated") == "negated"


@pytest.mark.parametrize(
    "spec, why",
    [("nope", "; e.g. --model.advantage twice"), ("no_such_module.f", r" \(no_such_module does not import: ModuleNotFoundError"),
     ("torch.no_such_function", r" \(torch has no 'no_such_function' and registers none\)")],
)  # fmt: skip
def test_an_unknown_name_or_path_is_refused_naming_the_option_and_the_registered_names(spec, why):
    parts = registry()
    parts.register("twice", double)
    with pytest.raises(ConfigError, match=f"^advantage: '{spec}' is not one of twice{why}"):
        parts.resolve(spec)


def test_a_path_to_what_is_not_a_part_is_refused_saying_what_a_part_is():
    with pytest.raises(ConfigError, match=r"^advantage: <class 'torch.Tensor'> is not a function rewards \[P, G\]"):
        registry().resolve("torch.Tensor")


def test_a_module_takes_a_function_by_its_import_path_and_keeps_the_path_in_its_hyperparameters():
    try:
        module = variants.GRPO("m", advantage="torch.neg")
        assert module.settings.advantage == module.hparams.advantage == "torch.neg"
        assert torch.equal(module.advantages(REWARDS), -REWARDS)
    finally:
        ADVANTAGES.pop("torch.neg", None)
        ADVANTAGES.sources.pop("torch.neg", None)


# ------------------------------------------------------------------ rewards.scale: a form of the advantage


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_the_advantage_under_each_reward_scale_is_its_registered_form(scale):
    module = variants.GRPO("m", advantage="group_std", rewards={"scale": scale})
    expected = F.group_normalized_advantages(REWARDS, scale=scale)
    assert torch.equal(ADVANTAGES.estimator("group_std", scale)(REWARDS), expected)
    assert torch.equal(module.advantages(REWARDS), expected)


def test_a_users_advantage_with_a_form_for_a_scale_takes_that_scale():
    try:
        register_advantage("centred")(F.group_centered_advantages)
        register_advantage("centred", scale="batch")(F.batch_normalized_advantages)
        assert ADVANTAGES.scales("centred") == ("group", "batch")
        module = variants.GRPO("m", advantage="centred", rewards={"scale": "batch"})
        assert torch.equal(module.advantages(REWARDS), F.batch_normalized_advantages(REWARDS))
        with pytest.raises(ConfigError, match="^rewards.scale: sets the divisor of group_std, centred's advantages"):
            variants.GRPO("m", advantage="centred", rewards={"scale": "none"})
    finally:
        for registered in (ADVANTAGES, ADVANTAGES.sources, ADVANTAGES.scaled):
            registered.pop("centred", None)


# ------------------------------------------------------------------ kl.placement: objects that say what they do


def test_each_shipped_placement_changes_only_its_side():
    loss, kl, mask, rewards = torch.ones(2, 3), torch.full((2, 3), 0.5), torch.ones(2, 3), torch.tensor([1.0, 2.0])
    in_loss, in_reward = KL_PLACEMENTS["loss"], KL_PLACEMENTS["reward"]
    assert torch.equal(in_loss.add_to_loss(loss, kl, 0.1), kl_in_loss(loss, kl, 0.1))
    assert in_loss.shape_rewards(rewards, kl, mask, 0.1) == (rewards, None) and not in_loss.in_reward
    assert in_reward.add_to_loss(loss, kl, 0.1) is loss and in_reward.in_reward
    assert_close(in_reward.shape_rewards(rewards, kl, mask, 0.1)[0], torch.tensor([0.85, 1.85]))  # 0.1 * 1.5 off
    assert (in_loss.estimator, in_reward.estimator) == ("k3", "k1")


class DoubleInLoss(KLPlacement):
    """Twice the KL term of ``loss``: what the update adds must come from the placement, not its name."""

    def add_to_loss(self, loss, kl, beta):
        return kl_in_loss(loss, kl, 2 * beta)


def test_the_update_adds_to_the_loss_what_the_placement_says(make_module, make_rollout, one_torch_thread):
    module = make_module(variants.GRPO, kl={"beta": 0.1, "placement": "loss"})
    rollout = make_rollout(module, ["12+34=", "5+6="])
    logp = module.compute_logprobs(module.policy, rollout)
    rollout.old_logp, rollout.ref_logp = logp, logp + 0.3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(0))
    rows = torch.arange(len(rollout))
    advantages = torch.linspace(-1.0, 1.0, len(rollout))

    def loss_with(placement: str) -> float:
        module.settings = dataclasses.replace(module.settings, kl_placement=placement)
        return module.micro_batch_loss(rollout, advantages, rows, len(rows), module.loss_mask(rollout, rows).sum()).item()

    try:
        KL_PLACEMENTS.register("double_in_loss", DoubleInLoss)
        without, once, twice = loss_with("reward"), loss_with("loss"), loss_with("double_in_loss")
    finally:
        KL_PLACEMENTS.pop("double_in_loss", None)
        KL_PLACEMENTS.sources.pop("double_in_loss", None)
    assert abs(once - without) > 1e-4
    assert twice - once == pytest.approx(once - without, rel=1e-4)


def test_an_import_path_finds_a_module_of_the_working_directory_as_reward_functions_do(tmp_path, monkeypatch):
    (tmp_path / "my_parts_of_the_cwd.py").write_text("def halved(rewards):\n    return rewards / 2\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_parts_of_the_cwd", raising=False)
    parts = registry()
    assert parts.resolve("my_parts_of_the_cwd.halved") == "my_parts_of_the_cwd.halved"
    assert torch.equal(parts["my_parts_of_the_cwd.halved"](REWARDS), REWARDS / 2)
