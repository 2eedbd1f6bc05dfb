"""LUSPO, VESPO, DPPO, GPG, DRO, MaxRL, OPSM and the entropy bonus: each preset's parts and defaults,
hand-computed values beyond its parts' cases (tests/conformance/; the papers' numbers where they give
them), and the options' micro-batch invariance."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

import variants
from grpo_lightning.algorithms import ADVANTAGES, SURROGATES
from grpo_lightning.algorithms.entropy import AdaptiveEntropy, entropy_bonus
from grpo_lightning.algorithms.masks import off_policy_sequence_mask
from grpo_lightning.algorithms.surrogates import vespo_weight
from grpo_lightning.errors import ConfigError
from tests.conftest import micro_batched_gradient

PROMPTS = ["12+34=", "5+6=", "77+8="]  # x group_size 4 = 12 rows

# Two completions of lengths 3 and 5 (width 5), advantages +1 and -1.
MASK = torch.tensor([[1.0, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
SIGNS = torch.tensor([1.0, -1.0])


def surrogate_loss(name, logp, old_logp, advantages, mask=MASK, **settings):
    return SURROGATES[name].loss(logp, old_logp, advantages, mask, **settings)[0]


def token_grad(loss, logp):
    return torch.autograd.grad(loss, logp)[0]


@pytest.mark.parametrize(
    "name, parts, defaults",
    [
        ("LUSPO", ("group_std", "gspo", "seq_mean_token_sum"), {"clip_eps_low": 2e-3, "clip_eps_high": 2.5e-3, "beta": 0.0}),
        ("VESPO", ("group_std", "vespo", "token_mean"), {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0}),
        ("DPPO", ("group_std", "dppo_tv", "token_mean"), {"clip_eps_low": 0.15, "clip_eps_high": 0.15, "clip_ratio_c": 20.0}),
        ("GPG", ("gpg", "reinforce", "token_mean"), {"beta": 0.0}),
        ("DRO", ("group_std", "dro", "seq_mean_token_sum"), {"dro_beta": 0.1, "beta": 0.0}),
        ("MaxRL", ("max_rl", "ppo_clip", "seq_mean_token_mean"), {"clip_eps_low": 0.2, "beta": 0.0}),
    ],
)
def test_each_preset_names_its_parts_and_the_papers_defaults(name, parts, defaults):
    module = getattr(variants, name)("unused")
    assert (module.advantage_name, module.surrogate_name, module.aggregation_name) == parts
    for option, value in defaults.items():  # the module's (as resolved for its surrogate), else its loss option
        assert getattr(module, option, getattr(module.loss_options, option, None)) == value, option


# ------------------------------------------------------------------ LUSPO


def test_luspo_on_policy_is_the_length_weighted_loss_and_its_gradient():
    logp = torch.full((2, 5), -1.0, requires_grad=True)
    module = variants.LUSPO("unused")
    loss = module.aggregate(module.token_loss(logp, logp.detach(), SIGNS, MASK), MASK)
    # s_i = 1 on-policy: l_i = -A_i; L = (3 * (-1) + 5 * (+1)) / 2 = +1.0.
    assert loss.item() == pytest.approx(1.0)
    # grad L = -(1/B) sum_i A_i sum_t grad log pi_it: -1/2 on the first row's tokens, +1/2 on the second's.
    assert_close(token_grad(loss, logp), -0.5 * SIGNS.unsqueeze(1) * MASK)


# ------------------------------------------------------------------ VESPO


@pytest.mark.parametrize(
    "w, advantage, phi",
    [(1.0, 1.0, 1.0), (1.0, -1.0, 1.0), (0.5, 1.0, 1.1204), (2.0, 1.0, 0.1991), (0.5, -1.0, 0.3398), (2.0, -1.0, 1.0827)],
)
def test_vespo_weight_matches_the_papers_values(w, advantage, phi):
    got = vespo_weight(torch.tensor([math.log(w)]), torch.tensor([advantage >= 0]), 2.0, 3.0, 3.0, 2.0)
    assert got.item() == pytest.approx(phi, abs=1e-4)


def test_vespo_refuses_the_rollout_correction():
    with pytest.raises(ConfigError, match="^sampling.correction: does not apply to VESPO"):
        variants.VESPO("unused", sampling={"correction": "token_truncate"})


# ------------------------------------------------------------------ DPPO


def test_dppo_divergence_picks_the_surrogate_and_its_bounds():
    module = variants.DPPO("unused", divergence="kl")
    assert (module.surrogate_name, module.clip_eps_low, module.clip_eps_high) == ("dppo_kl", 0.05, 0.05)
    with pytest.raises(ConfigError, match="^divergence: kl is the surrogate dppo_kl"):
        variants.DPPO("unused", divergence="kl", loss={"surrogate": "dppo_tv"})


# ------------------------------------------------------------------ MaxRL


def test_max_rl_divides_the_centred_reward_by_the_success_rate():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    want = torch.tensor([[0.75, -0.25, -0.25, -0.25], [0.0] * 4, [0.0] * 4])
    want[0] /= 0.25 + 1e-6  # success rate 1/4: +3 for the success, -1 for each failure
    assert_close(ADVANTAGES["max_rl"](rewards), want)
    with pytest.raises(ValueError, match="^max_rl: a group's rewards differ with a mean <= 0"):
        ADVANTAGES["max_rl"](torch.tensor([[1.0, -2.0]]))


# ------------------------------------------------------------------ OPSM and the entropy bonus


def test_opsm_drops_only_negative_advantage_completions_that_drifted_past_the_threshold():
    old = torch.zeros(3, 2)
    logp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-0.1, -0.1]])  # mean log(pi_old / pi): 1, 1, 0.1
    kept = off_policy_sequence_mask(logp, old, torch.tensor([1.0, -1.0, -1.0]), torch.ones(3, 2), threshold=0.5)
    assert kept.tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]


def test_the_entropy_bonus_gradient_is_minus_the_entropy_gradient_in_expectation():
    logits = torch.tensor([0.3, -1.0, 2.0, 0.5], requires_grad=True)
    log_pi = torch.log_softmax(logits, dim=0)
    expected = (log_pi.exp().detach() * entropy_bonus(log_pi, log_pi.detach())).sum()  # E_{y ~ pi} of the term
    (grad,) = torch.autograd.grad(expected, logits, retain_graph=True)
    (entropy_grad,) = torch.autograd.grad(-(log_pi.exp() * log_pi).sum(), logits)
    assert_close(grad, -entropy_grad)


def test_adaptive_entropy_steps_the_coefficient_toward_the_target_once_per_step_and_resumes():
    module = variants.GRPO("unused", loss={"entropy_coef": 0.01})
    control = AdaptiveEntropy(target=0.2, delta=0.005, min_coef=0.0, max_coef=0.012)
    control.on_train_start(None, module)
    steps = [(1, 0.1), (1, 0.1), (2, 0.1), (3, 0.5), (4, 0.5), (5, 0.5)]  # (logged steps, entropy) after each batch
    seen = []
    for logged, entropy in steps:
        module.logged_steps, module.last_step_metrics = logged, {"entropy": entropy}
        control.on_train_batch_end(None, module, None, None, 0)
        seen.append(round(module.entropy_coef, 6))
    # below the target: +0.005 (capped at 0.012), once per logged step; above it: -0.005, down to 0.
    assert seen == [0.012, 0.012, 0.012, 0.007, 0.002, 0.0]
    resumed, fresh = AdaptiveEntropy(), variants.GRPO("unused", loss={"entropy_coef": 0.01})
    resumed.load_state_dict(control.state_dict())
    resumed.on_train_start(None, fresh)
    assert fresh.entropy_coef == 0.0 and resumed.seen == 5


def test_adaptive_entropy_is_a_trainer_callback_on_the_command_line():
    from grpo_lightning.cli.app import GRPOLightningCLI
    from grpo_lightning.cli.resources import config_dir

    configs = config_dir()
    args = ["--config", str(configs / "trainer/cpu.yaml"), "--config", str(configs / "data/arithmetic.yaml"),
            "--model", "GRPO", "--model.model", "m", "--trainer.callbacks+=grpo_lightning.algorithms.entropy.AdaptiveEntropy",
            "--trainer.callbacks.target", "0.3"]  # fmt: skip
    trainer = GRPOLightningCLI(args=args, run=False).trainer
    (control,) = [c for c in trainer.callbacks if isinstance(c, AdaptiveEntropy)]
    assert control.target == 0.3
    with pytest.raises(ConfigError, match="^AdaptiveEntropy: needs target >= 0, delta > 0"):
        AdaptiveEntropy(delta=0.0)


def test_opsm_and_entropy_coef_refuse_invalid_values():
    with pytest.raises(ConfigError, match="^loss.off_policy_mask_threshold: must be >= 0"):
        variants.GRPO("unused", loss={"off_policy_mask_threshold": -0.1})
    with pytest.raises(ConfigError, match="^loss.entropy_coef: must be a finite number >= 0"):
        variants.GRPO("unused", loss={"entropy_coef": -1e-3})


# ------------------------------------------------------------------ micro-batch invariance


def off_policy_gradients(module, rollout, sizes):
    n = len(rollout)
    advantages = module.advantages(rollout.rewards.view(-1, rollout.group_size)).flatten()
    return micro_batched_gradient(module, rollout, advantages, sizes, module.loss_mask(rollout, torch.arange(n)).sum())


def test_opsm_the_entropy_bonus_and_the_dual_clip_give_the_same_gradient_in_any_micro_batches(
    make_module, make_rollout, one_torch_thread
):
    """The presets are registered parts, each checked alone (tests/algorithms/test_surrogates.py, tests/algorithms/test_algorithm_parts.py);
    the options added to the surrogate are checked here, together."""
    name = "GRPO"
    kwargs = {
        "loss": {"off_policy_mask_threshold": 0.05, "entropy_coef": 0.01, "clip_ratio_c": 1.5},
        "kl": {"beta": 0.0},
    }
    module = make_module(getattr(variants, name), **kwargs)
    rollout = make_rollout(module, PROMPTS)
    logp = module.compute_logprobs(module.policy, rollout)
    rollout.old_logp = logp + 0.3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(1))
    whole = off_policy_gradients(module, rollout, [len(rollout)])
    split = off_policy_gradients(module, rollout, [5, 4, 3])
    assert any(g.abs().sum() > 0 for g in whole.values())
    for key in whole:
        assert_close(split[key], whole[key], rtol=1e-5, atol=1e-7, msg=lambda m: f"{name}, {key}: {m}")


def test_dppo_without_a_cap_stays_finite_where_the_ratio_overflows():
    logp, old = torch.tensor([[0.0]], requires_grad=True), torch.tensor([[-200.0]])  # r = e^200 overflows float32
    loss = surrogate_loss("dppo_tv", logp, old, torch.tensor([[-1.0]]), None, clip_eps_low=1.0, clip_eps_high=1.0,
                          clip_ratio_c=None)  # fmt: skip
    assert torch.isfinite(token_grad(loss.sum(), logp)).all()
