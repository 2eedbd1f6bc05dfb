"""Never train on NaN: a step whose gradient is not finite (a NaN reward that reached the
advantages, an infinite log-prob) changes no weight, is counted and warned about, and the run ends
with exactly the weights of a run whose step trained on nothing; too many in a row stop the fit."""

from __future__ import annotations

import pytest
import torch

from grpo_lightning.runtime.optimization.nonfinite import NonFiniteGuard, NonFiniteTrainingError
from grpo_lightning.errors import ConfigError
from grpo_lightning.variants import GRPO
from tests.helpers import fit, make_module, merged

BAD_STEP = 1  # global step (0-based) of the poisoned update


def test_the_guard_counts_warns_and_stops_after_too_many_in_a_row():
    guard = NonFiniteGuard(max_in_a_row=2)
    assert guard.allows(torch.tensor(3.0), step=0)
    with pytest.warns(RuntimeWarning, match=r"step 1: the gradient norm is nan.*skipped.*'2\+2='"):
        assert not guard.allows(torch.tensor(float("nan")), step=1, prompts=["2+2=", "3+3="])
    assert guard.allows(torch.tensor(1.0), step=2) and guard.in_a_row == 0 and guard.skipped == 1
    with pytest.warns(RuntimeWarning):
        assert not guard.allows(torch.tensor(float("inf")), step=3)
    with pytest.raises(NonFiniteTrainingError, match="2 non-finite steps in a row.*max_nonfinite_steps"):
        guard.allows(torch.tensor(float("-inf")), step=4)
    with pytest.raises(ConfigError, match="optim.max_nonfinite_steps: must be a positive integer"):
        GRPO(model="m", optim={"max_nonfinite_steps": 0})


class Poisoned(GRPO):
    """GRPO whose update at ``BAD_STEP`` meets ``poison``: a NaN reward, an infinite log-prob, or
    (the reference run) no gradient at all."""

    poison = "none"

    def shape_rewards(self, rewards, rollout):
        if self.poison == "nan_reward" and self.global_step == BAD_STEP:
            rewards = rewards.clone()
            rewards[0] = float("nan")
        return super().shape_rewards(rewards, rollout)

    def _forward(self, model, rollout, rows, with_entropy=True):
        logp, entropy = super()._forward(model, rollout, rows, with_entropy)
        if self.poison == "inf_logprob" and self.global_step == BAD_STEP and model is self.policy and torch.is_grad_enabled():
            logp = logp + torch.where(torch.arange(logp.numel()).view_as(logp) == 0, float("-inf"), 0.0)
        return logp, entropy

    def accumulate_gradients(self, rollout, advantages, rows):
        if self.poison == "no_gradient" and self.global_step == BAD_STEP:
            return  # the step trains on nothing: what the poisoned steps must amount to
        super().accumulate_gradients(rollout, advantages, rows)


def run(tiny_model_dir, tmp_path, poison: str, steps: int = 3, **settings):
    module = make_module(tiny_model_dir, cls=Poisoned, **merged({"policy": {"dtype": "float32"}}, settings))
    module.poison = poison
    recorded, _ = fit(module, steps, tmp_path / poison)
    return module, recorded


@pytest.mark.parametrize("poison", ["nan_reward", "inf_logprob"])
def test_a_poisoned_step_changes_no_weight(poison, tiny_model_dir, tmp_path):
    clean, clean_steps = run(tiny_model_dir, tmp_path, "no_gradient")
    with pytest.warns(RuntimeWarning, match=f"step {BAD_STEP}: the gradient norm is (nan|inf)"):
        poisoned, steps = run(tiny_model_dir, tmp_path, poison)
    assert poisoned.nonfinite.skipped == 1 and clean.nonfinite.skipped == 0
    assert steps[3]["skipped_steps"] == 1 and not torch.isfinite(torch.as_tensor(steps[BAD_STEP + 1]["grad_norm"]))
    for (name, ours), (_, reference) in zip(poisoned.policy.named_parameters(), clean.policy.named_parameters()):
        assert torch.equal(ours, reference), name
    after = {k: v for k, v in steps[3].items() if k != "skipped_steps"}
    torch.testing.assert_close(after, {k: v for k, v in clean_steps[3].items() if k in after}, rtol=0, atol=0,
                               msg=lambda m: f"the step after the skipped one differs: {m}")  # fmt: skip


def test_non_finite_steps_in_a_row_stop_the_fit(tiny_model_dir, tmp_path):
    class AlwaysInf(Poisoned):
        def _forward(self, model, rollout, rows, with_entropy=True):
            logp, entropy = GRPO._forward(self, model, rollout, rows, with_entropy)
            return (logp * float("inf") if model is self.policy and torch.is_grad_enabled() else logp), entropy

    module = make_module(tiny_model_dir, cls=AlwaysInf, policy={"dtype": "float32"}, optim={"max_nonfinite_steps": 2})
    with pytest.warns(RuntimeWarning), pytest.raises(NonFiniteTrainingError, match="2 non-finite steps in a row"):
        fit(module, 5, tmp_path)
    assert module.global_step == 1  # the first skipped step counted; the second stopped the fit
