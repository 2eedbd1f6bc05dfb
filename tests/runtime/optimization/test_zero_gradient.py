"""No harm without signal: an optimizer step whose gradient is exactly zero (every group's rewards
equal, so every advantage is zero, and no term that does not depend on advantages) moves no
weight, as if it had trained on nothing; with the KL term on, the same step still moves them."""

from __future__ import annotations

import torch

from grpo_lightning.variants import GRPO
from tests.helpers import fit, make_module, merged

FLAT_STEP = 1  # global step (0-based) whose rewards are all equal


class FlatRewards(GRPO):
    """GRPO whose rewards at ``FLAT_STEP`` are all equal (``"flat"``), or whose update there trains
    on nothing (``"no_gradient"``, the reference)."""

    case = "flat"

    def shape_rewards(self, rewards, rollout):
        if self.case == "flat" and self.global_step == FLAT_STEP:
            rewards = torch.zeros_like(rewards)
        return super().shape_rewards(rewards, rollout)

    def accumulate_gradients(self, rollout, advantages, rows):
        if self.case == "no_gradient" and self.global_step == FLAT_STEP:
            return
        super().accumulate_gradients(rollout, advantages, rows)


def run(tiny_model_dir, root, case: str, **settings):
    module = make_module(tiny_model_dir, cls=FlatRewards, **merged({"policy": {"dtype": "float32"}}, settings))
    module.case = case
    steps, _ = fit(module, 3, root / case)
    return module, steps


def test_a_step_with_equal_rewards_everywhere_moves_no_weight(tiny_model_dir, tmp_path):
    flat, steps = run(tiny_model_dir, tmp_path, "flat", kl={"beta": 0.0})
    reference, _ = run(tiny_model_dir, tmp_path, "no_gradient", kl={"beta": 0.0})
    assert steps[FLAT_STEP + 1]["grad_norm"] == 0 and steps[FLAT_STEP + 1]["frac_zero_gradient"] == 1
    assert steps[FLAT_STEP]["frac_zero_gradient"] == 0 and steps[FLAT_STEP + 2]["frac_zero_gradient"] == 0
    for (name, ours), (_, expected) in zip(flat.policy.named_parameters(), reference.policy.named_parameters()):
        assert torch.equal(ours, expected), name  # Adam's momentum from step 0 did not carry through the flat step
    assert flat.global_step == 3  # the flat step still counts towards max_steps


def test_with_the_kl_term_on_a_step_with_equal_rewards_still_trains(tiny_model_dir, tmp_path):
    flat, steps = run(tiny_model_dir, tmp_path, "flat", kl={"beta": 0.04})
    reference, _ = run(tiny_model_dir, tmp_path, "no_gradient", kl={"beta": 0.04})
    assert steps[FLAT_STEP + 1]["grad_norm"] > 0 and steps[FLAT_STEP + 1]["frac_zero_gradient"] == 0
    assert any(not torch.equal(a, b) for a, b in zip(flat.policy.parameters(), reference.policy.parameters()))
