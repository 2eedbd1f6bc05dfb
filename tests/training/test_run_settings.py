"""The run's settings (:mod:`grpo_lightning.training.run_settings`): resolved once and frozen, the
coefficients a schedule steers changed through one method that logs them, and a surrogate's options
looked up where the run declares them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from grpo_lightning import variants
from grpo_lightning.algorithms import SURROGATES, register_surrogate
from grpo_lightning.errors import ConfigError

#: The hyperparameters the module once copied onto itself: the settings and coefficients hold them now.
OLD_ATTRIBUTES = ("beta", "kl_estimator", "entropy_coef", "clip_eps_low", "clip_eps_high", "ppo_epochs",
                  "rollout_correction", "minibatch_size", "micro_batch_size", "group_size", "kl_placement",
                  "advantage_name", "aggregation_name", "surrogate_name")  # fmt: skip


def test_the_settings_hold_the_resolved_values_and_are_frozen():
    grpo = variants.GRPO("m", loss={"surrogate": "gspo", "clip_eps_low": None, "clip_eps_high": None},
                         sampling={"group_size": 4}, optim={"minibatch_size": 8, "micro_batch_size": 2})  # fmt: skip
    settings = grpo.settings
    assert (settings.advantage, settings.surrogate, settings.aggregation) == ("group_std", "gspo", "seq_mean_token_mean")
    assert (settings.clip_eps_low, settings.clip_eps_high) == (3e-4, 4e-4)  # None: GSPO's own bounds
    assert dict(settings.surrogate_options) == {"clip_eps_low": 3e-4, "clip_eps_high": 4e-4}
    assert grpo.loss_options.clip_eps_high is None  # the option keeps what was configured
    assert (settings.group_size, settings.ppo_epochs, settings.minibatch_size, settings.micro_batch_size) == (4, 1, 8, 2)
    assert (settings.kl_placement, settings.kl_estimator) == ("loss", "k3")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.clip_eps_high = 0.28
    assert not set(OLD_ATTRIBUTES) & set(vars(grpo))


def test_the_kl_placement_and_estimator_resolve_from_the_variant():
    rloo = variants.RLOO("m")
    assert (rloo.settings.kl_placement, rloo.settings.kl_estimator, rloo.coefficients.beta) == ("reward", "k1", 0.05)


def test_set_coefficient_changes_the_one_value_in_use_and_logs_it():
    grpo = variants.GRPO("m", loss={"entropy_coef": 0.01})
    grpo.set_coefficient("entropy_coef", 0.02)
    assert (grpo.coefficients.entropy_coef, grpo.loss_options.entropy_coef) == (0.02, 0.01)  # now; the start value
    assert grpo.step_metrics.compute_and_reset()["entropy/coef"] == pytest.approx(0.02)
    with pytest.raises(dataclasses.FrozenInstanceError):
        grpo.coefficients.beta = 0.1
    with pytest.raises(ValueError, match="^set_coefficient: 'kl_coef' is not a coefficient a schedule steers; give one of beta"):
        grpo.set_coefficient("kl_coef", 0.1)


# ------------------------------------------------------------------ a surrogate's options


@pytest.fixture
def gated_surrogate():
    """A user's surrogate that takes ``gate`` and has no default for it, registered for one test."""

    @register_surrogate("gated_for_test")
    def gated(logp, old_logp, advantages, mask, *, gate, clip_eps_high=0.2):
        return -gate * advantages.unsqueeze(-1) * logp, {}

    yield "gated_for_test"
    SURROGATES.pop("gated_for_test", None)
    SURROGATES.sources.pop("gated_for_test", None)


class Gated(variants.GRPO):
    """A variant that declares the gated surrogate's option as its own argument."""

    def __init__(self, model: str, *, gate: float = 0.5, **kwargs) -> None:
        super().__init__(model, **kwargs)


def test_a_surrogate_needing_an_option_the_run_lacks_is_an_error_naming_it(gated_surrogate):
    with pytest.raises(ConfigError, match="^loss.surrogate: gated_for_test needs gate, which is neither a loss option "
                                          "nor an argument of GRPO; pick a variant that takes gate"):  # fmt: skip
        variants.GRPO("m", loss={"surrogate": gated_surrogate})


def test_a_surrogate_takes_the_variants_own_argument_and_the_resolved_clip(gated_surrogate):
    gated = Gated("m", gate=2.0, loss={"surrogate": gated_surrogate, "clip_eps_high": 0.28})
    assert gated.settings.surrogate_options == (("gate", 2.0), ("clip_eps_high", 0.28))
    logp, advantages = torch.zeros(2, 3), torch.tensor([1.0, -1.0])
    loss = gated.token_loss(logp + 0.5, logp, advantages, torch.ones(2, 3))
    assert torch.equal(loss, -2.0 * advantages.unsqueeze(-1) * (logp + 0.5))


def test_sapos_temperatures_come_from_its_own_arguments_and_the_papers_elsewhere():
    assert variants.SAPO("m", tau_pos=0.5).settings.surrogate_options == (("tau_pos", 0.5), ("tau_neg", 1.05))
    assert variants.GRPO("m", loss={"surrogate": "sapo"}).settings.surrogate_options == ()  # the function's defaults
