"""Rollout/training mismatch: both engines record the sampled tokens' log-probs as the training
pass computes them, the mismatch metrics and the importance-sampling corrections by hand values,
and a real fit logging them."""

from __future__ import annotations

import dataclasses
import math

import lightning as L
import pytest
import torch

from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.rollout.types import SamplingParams
from grpo_lightning.algorithms.rollout_correction import (
    BOUNDS,
    CORRECTIONS,
    Correction,
    binary_kl,
    check_old_logprobs,
    correct_policy_loss,
    correction_keep,
    correction_weights,
    importance_ratio,
    mismatch_metrics,
    proximal_logprobs,
    second_moment_mask,
)
from grpo_lightning.errors import ConfigError
from grpo_lightning.variants import GRPO
from tests.helpers import length_parity_reward, micro_batched_gradient

TRAIN = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.4, 0.4, 0.1]]))
# Rollout probabilities: ratios rho = train / rollout of [[0.5, 3, 1], [1, 0.8, 1 (masked)]].
SAMPLING = torch.log(torch.tensor([[1.0, 0.1, 0.2], [0.4, 0.5, 0.9]]))
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def close(got: torch.Tensor, expected: list) -> None:
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-6, rtol=1e-6)


def test_token_and_sequence_ratios_by_hand():
    close(importance_ratio(TRAIN, SAMPLING, MASK, "token"), [[0.5, 3.0, 1.0], [1.0, 0.8, 1.0]])
    # sequence: the product over a completion's tokens, 0.5 * 3 * 1 = 1.5 and 1 * 0.8 = 0.8
    close(importance_ratio(TRAIN, SAMPLING, MASK, "sequence"), [[1.5, 1.5, 1.5], [0.8, 0.8, 1.0]])


@pytest.mark.parametrize(
    ("mode", "cap", "expected"),
    [
        ("token_truncate", 2.0, [[0.5, 2.0, 1.0], [1.0, 0.8, 1.0]]),
        # MIS (TRL's token_mask / sequence_mask): the ratio where it is <= C, zero above it.
        ("token_mask", 2.0, [[0.5, 0.0, 1.0], [1.0, 0.8, 1.0]]),
        ("sequence_truncate", 1.2, [[1.2, 1.2, 1.2], [0.8, 0.8, 1.0]]),
        ("sequence_mask", 1.2, [[0.0, 0.0, 0.0], [0.8, 0.8, 1.0]]),  # products 1.5 > 1.2, 0.8 kept
        ("sequence_mask", 2.0, [[1.5, 1.5, 1.5], [0.8, 0.8, 1.0]]),
    ],
)
def test_correction_weights_by_hand(mode, cap, expected):
    close(correction_weights(TRAIN, SAMPLING, MASK, mode, cap), expected)


def test_mismatch_metrics_by_hand():
    metrics = {name: value.item() for name, (value, _) in mismatch_metrics(TRAIN, SAMPLING, MASK).items()}
    gaps = [math.log(2), math.log(3), 0.0, 0.0, abs(math.log(0.8))]
    assert metrics["sampling/sampling_logp_difference/mean"] == pytest.approx(sum(gaps) / 5)
    assert metrics["sampling/sampling_logp_difference/max"] == pytest.approx(math.log(3))
    assert metrics["sampling/importance_sampling_ratio/min"] == pytest.approx(0.5)
    assert metrics["sampling/importance_sampling_ratio/mean"] == pytest.approx((0.5 + 3 + 1 + 1 + 0.8) / 5)
    assert metrics["sampling/importance_sampling_ratio/max"] == pytest.approx(3.0)


def test_bad_settings_name_the_field(tiny_model_dir):
    with pytest.raises(ConfigError, match="sampling.correction: 'tis' is not one of token_truncate"):
        GRPO(model=tiny_model_dir, sampling={"correction": "tis"})
    with pytest.raises(ConfigError, match="sampling.correction_cap: must be >= 1"):
        GRPO(model=tiny_model_dir, sampling={"correction_cap": 0.5})


@pytest.mark.parametrize("rollout", ["hf", "static"])
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_engines_record_the_log_probs_the_training_pass_computes(make_module, rollout, temperature, top_p):
    # fp32 on a CPU: the engines and the training pass agree to rounding. Top-p changes what is
    # drawn, not the recorded distribution (softmax(logits / T), as the training pass computes it).
    grpo = make_module(
        GRPO, engine=EngineOptions(rollout=rollout), policy={"dtype": "float32"}, sampling={"max_new_tokens": 6}
    )
    grpo.sampling = SamplingParams(max_new_tokens=6, temperature=temperature, top_p=top_p)
    torch.manual_seed(0)
    rollout_ = grpo.generate({"prompt": ["1+2=", "30+4=", "7="]}, 3, grpo.sampling, with_logprobs=True)
    assert rollout_.sampling_logp is not None and rollout_.sampling_logp.shape == rollout_.completion_ids.shape
    train = grpo.compute_logprobs(grpo.policy, rollout_)
    mask = rollout_.completion_mask.bool()
    assert torch.allclose(rollout_.sampling_logp[mask], train[mask], atol=1e-4)
    assert (rollout_.sampling_logp[~mask] == 0).all()


@pytest.mark.parametrize("correction", [None, "token_truncate", "sequence_mask", "m2po", "geo_rs"])
def test_a_fit_logs_the_mismatch_and_trains_with_each_correction(make_module, tmp_path, correction, one_torch_thread):
    grpo = make_module(
        GRPO,
        configure=False,
        sampling={"correction": correction},
        rewards={"funcs": [length_parity_reward]},
        kl={"beta": 0.0},
        optim={"learning_rate": 1e-3},
    )
    from grpo_lightning.data import ArithmeticDataModule

    trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        limit_val_batches=0, default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(grpo, datamodule=ArithmeticDataModule(batch_size=2, num_train=16, num_val=4))
    metrics = grpo.last_step_metrics
    assert metrics["sampling/importance_sampling_ratio/min"] <= 1.0 + 1e-4 <= metrics["sampling/importance_sampling_ratio/max"] + 2e-4
    assert 0.0 <= metrics["sampling/sampling_logp_difference/mean"] < 1e-3  # one engine, fp32: rounding only
    assert 0.0 <= metrics["sampling/behaviour_kl"] < 1e-3
    if correction is not None:  # the share of tokens a correction gave weight 0: none, at ratios of 1
        assert metrics["sampling/masked_fraction"] == 0.0
    assert math.isfinite(metrics["loss"])


# ---------------------------------------------------------------- the 2026 corrections
# On TRAIN / SAMPLING: squared log-ratios of the masked tokens are ln(0.5)^2 = 0.4805, ln(3)^2 = 1.2069,
# 0, 0 and ln(0.8)^2 = 0.0498; the geometric-mean ratios are 1.5^(1/3) = 1.1447 and 0.8^(1/2) = 0.8944.


def test_the_2026_corrections_are_registered():
    assert {"icepop", "geo_rs", "kpop", "m2po"} <= set(CORRECTIONS)
    assert set(CORRECTIONS) == set(BOUNDS)


@pytest.mark.parametrize(
    ("mode", "bounds", "expected"),
    [
        # IcePop: the ratio inside [lower, upper], zero outside (0.5 and 3 leave [0.6, 2]).
        ("icepop", dict(lower=0.6, upper=2.0), [[0.0, 0.0, 1.0], [1.0, 0.8, 1.0]]),
        ("icepop", dict(lower=0.5, upper=5.0), [[0.5, 3.0, 1.0], [1.0, 0.8, 1.0]]),  # the bounds are kept
        # geo_rs: 1.1447 is inside [0.9, 1.2], 0.8944 below it: the second completion is rejected.
        ("geo_rs", dict(lower=0.9, upper=1.2), [[1.0, 1.0, 1.0], [0.0, 0.0, 1.0]]),
        ("geo_rs", dict(lower=0.999, upper=1.001), [[0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]),
        # kpop: binary KLs 0.5 vs 1.0: 7.28 (1 - q bounded at eps = 2^-23); 0.3 vs 0.1: 0.1537 (and 0.1163 reversed); 0.4 vs 0.5: 0.0204.
        ("kpop", dict(kl_threshold=0.05), [[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]),
        ("kpop", dict(kl_threshold=0.2), [[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]]),
        ("kpop", dict(kl_threshold=0.02), [[0.0, 0.0, 1.0], [1.0, 0.0, 1.0]]),
        # m2po: sorted 0, 0, 0.0498, 0.4805, 1.2069 have running means 0, 0, 0.0166, 0.1326, 0.3475.
        ("m2po", dict(second_moment=0.04), [[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]),
        ("m2po", dict(second_moment=0.2), [[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]),
        ("m2po", dict(second_moment=0.01), [[0.0, 0.0, 1.0], [1.0, 0.0, 1.0]]),
    ],
)
def test_2026_correction_weights_by_hand(mode, bounds, expected):
    close(correction_weights(TRAIN, SAMPLING, MASK, mode, **bounds), expected)


def test_binary_kl_by_hand():
    p, q = torch.log(torch.tensor([0.4, 0.3, 0.2])), torch.log(torch.tensor([0.5, 0.1, 0.2]))
    # 0.4 ln(0.8) + 0.6 ln(1.2); 0.3 ln(3) + 0.7 ln(7/9); 0
    close(binary_kl(p, q), [0.4 * math.log(0.8) + 0.6 * math.log(1.2), 0.3 * math.log(3) + 0.7 * math.log(7 / 9), 0.0])
    # q = 1 (log q rounds to 0), p = 0.5: 1 - q is bounded below at float32's eps = 2^-23, so the KL is
    # 0.5 ln 0.5 + 0.5 ln(0.5 / eps) = 0.5 (23 ln 2 - 2 ln 2) = 7.2780 (finite, far above any phi), and 0.6931 the other way
    eps = 2.0**-23
    kl = binary_kl(torch.tensor([math.log(0.5), 0.0]), torch.tensor([0.0, math.log(0.5)]))
    torch.testing.assert_close(kl, torch.tensor([0.5 * math.log(0.5) + 0.5 * math.log(0.5 / eps),
                                                 math.log(2) + eps * math.log(2 * eps)]))  # fmt: skip


def test_kpop_keeps_a_near_certain_token_whose_passes_agree():
    # float32 log-probs of a near-certain token: the training pass rounds to exactly 0, the rollout's
    # is -5 eps = -5.96e-7 (eps = 2^-23), so 1 - q = 5 eps (to 3e-13) and 1 - p is bounded at eps:
    # KL_b(p || q) = 5 eps + eps ln(eps / 5 eps) = eps (5 - ln 5) = 4.0419e-7,
    # KL_b(q || p) = (1 - 5 eps)(-5 eps) + 5 eps ln 5 = 5 eps (ln 5 - 1) = 3.6325e-7 (to 1e-12): far below phi = 0.05.
    eps = 2.0**-23
    train, sampling = torch.tensor([[0.0]]), torch.tensor([[-5 * eps]])
    torch.testing.assert_close(binary_kl(train, sampling), torch.tensor([[eps * (5 - math.log(5))]]), rtol=1e-4, atol=0)
    torch.testing.assert_close(binary_kl(sampling, train), torch.tensor([[5 * eps * (math.log(5) - 1)]]), rtol=1e-4, atol=0)
    close(correction_weights(train, sampling, torch.ones(1, 1), "kpop"), [[1.0]])
    # a token whose probabilities really differ is still masked: q = 1 against p = 0.9 gives
    # 0.9 ln 0.9 + 0.1 ln(0.1 / eps) = 1.2692, and 0.5 against 0.3 the binary KLs 0.0872 / 0.0823 > 0.05
    train, sampling = torch.log(torch.tensor([[0.9, 0.5]])), torch.log(torch.tensor([[1.0, 0.3]]))
    close(correction_weights(train, sampling, torch.ones(1, 2), "kpop"), [[0.0, 0.0]])


def test_m2po_keeps_the_second_moment_under_tau_and_drops_ties_with_the_first_dropped():
    # (log rho)^2 = 0, 0.09, 0.09: running means 0, 0.045, 0.06; tau 0.05 keeps two, but the second ties the third.
    train, sampling, mask = torch.tensor([[0.0, 0.3, -0.3]]), torch.zeros(1, 3), torch.ones(1, 3)
    close(second_moment_mask(train, sampling, mask, 0.05), [[1.0, 0.0, 0.0]])
    kept = second_moment_mask(TRAIN, SAMPLING, MASK, 0.04).bool() & MASK.bool()
    assert float(((TRAIN - SAMPLING)[kept] ** 2).mean()) <= 0.04


class Recorder:
    def __init__(self):
        self.values = {}

    def update(self, name, value, weight=1.0, reduce="mean"):
        self.values[name] = float(value)


def test_the_loss_is_weighted_and_the_behaviour_kl_and_masked_share_logged_by_hand():
    recorder = Recorder()
    loss = torch.ones(2, 3)
    weighted = correct_policy_loss(loss, TRAIN, SAMPLING, MASK, Correction("token_mask"), recorder)
    close(weighted, [[0.5, 0.0, 1.0], [1.0, 0.8, 1.0]])
    assert recorder.values["sampling/masked_fraction"] == pytest.approx(1 / 5)  # rho = 3 > 2
    # k3 = rho - 1 - ln(rho) over rho = 0.5, 3, 1, 1, 0.8
    k3 = [r - 1 - math.log(r) for r in (0.5, 3.0, 1.0, 1.0, 0.8)]
    assert recorder.values["sampling/behaviour_kl"] == pytest.approx(sum(k3) / 5)
    # weights chosen over the whole rollout (m2po's) are taken as given
    given = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    close(correct_policy_loss(loss, TRAIN, SAMPLING, MASK, Correction("m2po"), recorder, given), given.tolist())


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"correction": "icepop", "correction_lower": 1.5}, "^sampling.correction_lower: must be in \\[0, 1\\]"),
        ({"correction": "geo_rs", "correction_upper": 0.99}, "^sampling.correction_upper: must be >= 1"),
        ({"correction": "kpop", "correction_kl_threshold": 0.0}, "^sampling.correction_kl_threshold: must be > 0"),
        ({"correction": "m2po", "correction_second_moment": -1.0}, "^sampling.correction_second_moment: must be > 0"),
        ({"correction": "icepop", "correction_second_moment": 0.1}, "^sampling.correction_second_moment: bounds sampling.correction m2po, not icepop"),
        ({"correction_lower": 0.5}, "^sampling.correction_lower: bounds sampling.correction icepop, geo_rs, not None"),
        ({"correction": "kpop", "correction_cap": 3.0}, "^sampling.correction_cap: bounds sampling.correction token_truncate"),
    ],
)
def test_bad_bounds_name_the_field_and_the_fix(tiny_model_dir, sampling, message):
    with pytest.raises(ConfigError, match=message):
        GRPO(model=tiny_model_dir, sampling=sampling)


def test_the_loglinear_proximal_log_probs_by_hand():
    # behaviour -2, current -1; sampled at versions 2, 4, 6, the update started at 4, the weights at 6:
    # alpha = (4 - 2) / (6 - 2) = 0.5, (4 - 4) / (6 - 4) = 0, and 1 where nothing changed since sampling.
    logp, sampling = torch.full((1, 3), -1.0), torch.full((1, 3), -2.0)
    got = proximal_logprobs(logp, sampling, torch.tensor([[2, 4, 6]]), torch.tensor([4]), 6)
    close(got, [[-1.5, -2.0, -1.0]])


@pytest.mark.parametrize("mode", CORRECTIONS)
def test_every_correction_keeps_agreeing_tokens_ignores_padding_and_passes_no_gradient(mode):
    """Where the engines agree (rho = 1) each correction keeps every token at weight 1 with its
    default bounds; outside the mask its weight is 1; its weights are finite, >= 0 and detached."""
    generator = torch.Generator().manual_seed(0)
    train = torch.rand(4, 5, generator=generator).clamp(min=0.05).log().requires_grad_()
    mask = torch.tensor([[1.0] * 5, [1.0] * 3 + [0.0] * 2, [1.0] * 4 + [0.0], [1.0] + [0.0] * 4])
    close(correction_weights(train, train.detach(), mask, mode), torch.ones(4, 5).tolist())
    sampling = (train.detach() + torch.randn(4, 5, generator=generator)).clamp(max=0.0)
    weights = correction_weights(train, sampling, mask, mode)
    assert not weights.requires_grad and torch.isfinite(weights).all() and (weights >= 0).all()
    assert (weights[mask == 0] == 1).all()


def test_m2po_weights_chosen_over_the_rollout_do_not_depend_on_the_micro_batch_size(make_module, one_torch_thread):
    grpo = make_module(GRPO, policy={"dtype": "float32"}, sampling={"correction": "m2po"}, kl={"beta": 0.0})
    torch.manual_seed(0)
    rollout = grpo.generate({"prompt": ["1+2=", "30+4="]}, grpo.settings.group_size, grpo.sampling, with_logprobs=True)
    generator = torch.Generator().manual_seed(1)
    noise = 0.3 * torch.randn(rollout.completion_ids.shape, generator=generator)  # a stale sampler: some tokens go
    rollout.sampling_logp = (rollout.sampling_logp + noise).clamp(max=0.0) * rollout.completion_mask
    grpo.compute_old_logprobs(rollout)
    weights = rollout.derived["correction_weights"]
    assert 0 < (weights[rollout.completion_mask > 0] == 0).sum() < rollout.completion_mask.sum()
    advantages, n = torch.linspace(-1.0, 1.0, len(rollout)), len(rollout)
    tokens = grpo.loss_mask(rollout, torch.arange(n)).sum()
    whole = micro_batched_gradient(grpo, rollout, advantages, [n], tokens)
    for sizes in ([1] * n, [3, 5]):
        split = micro_batched_gradient(grpo, rollout, advantages, sizes, tokens)
        for name in whole:
            torch.testing.assert_close(split[name], whole[name], rtol=1e-4, atol=1e-6)


def test_a_completion_geo_rs_rejects_leaves_the_loss_mask_as_a_masked_truncated_one(make_module, one_torch_thread):
    """verl's geometric rejection takes a rejected completion out of the response mask: the gradient
    (policy loss and KL term, token-mean over the kept tokens) is the uncorrected one's with that
    completion masked as a truncated one is under ``mask_truncated_completions``, whatever the micro-batches."""
    sampling = {"correction": "geo_rs", "correction_lower": 0.9, "correction_upper": 1.1}
    geo = make_module(GRPO, policy={"dtype": "float32"}, sampling=sampling, kl={"beta": 0.1})
    torch.manual_seed(0)
    rollout = geo.generate({"prompt": ["1+2=", "30+4="]}, geo.settings.group_size, geo.sampling, with_logprobs=True)
    n, mask = len(rollout), rollout.completion_mask
    shift = torch.tensor([0.0, 0.5, 0.0, -0.5] * (n // 4)).unsqueeze(1)  # rows 1 and 3: geometric ratio e^-0.5, e^0.5
    rollout.sampling_logp = rollout.sampling_logp + shift * mask
    rollout.ref_logp = rollout.sampling_logp - 0.2 * mask
    geo.step_metrics.compute_and_reset()
    geo.compute_old_logprobs(rollout)
    kept = torch.tensor([1.0, 0.0, 1.0, 0.0] * (n // 4))
    close(rollout.derived["rejection_keep"], (kept.unsqueeze(1) * mask + (1 - mask)).tolist())
    share = float((mask * (1 - kept).unsqueeze(1)).sum() / mask.sum())
    assert geo.step_metrics.compute_and_reset()["sampling/masked_fraction"] == pytest.approx(share)
    advantages = torch.linspace(-1.0, 1.0, n)
    tokens = geo.loss_mask(rollout, torch.arange(n)).sum()
    assert tokens == (mask * kept.unsqueeze(1)).sum()

    plain = make_module(GRPO, policy={"dtype": "float32"}, kl={"beta": 0.1}, loss={"mask_truncated_completions": True})
    plain.policy.load_state_dict(geo.policy.state_dict())
    truncated = dataclasses.replace(rollout, truncated=kept == 0, derived={})
    expected = micro_batched_gradient(plain, truncated, advantages, [n], tokens)
    for sizes in ([n], [1] * n, [3, n - 3]):
        got = micro_batched_gradient(geo, rollout, advantages, sizes, tokens)
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-7)


def test_mask_corrections_weigh_an_overflowing_ratio_zero_not_nan():
    # log-ratios of 60 per token: the product exp(120) overflows float32 to inf, and the token ratio exp(100) too
    sampling, mask = torch.tensor([[-60.0, -60.0], [-100.0, 0.0]]), torch.ones(2, 2)
    close(correction_weights(torch.zeros(2, 2), sampling, mask, "sequence_mask"), [[0.0, 0.0], [0.0, 0.0]])
    close(correction_weights(torch.zeros(2, 2), sampling, mask, "token_mask"), [[0.0, 0.0], [0.0, 1.0]])


# ---------------------------------------------------------------- old_logprobs: bypass
# Under bypass the update's ratio is pi_theta / pi_rollout, the importance weight itself: a correction
# adds only its rejection (0 or 1), as verl's bypass mode with the PPO loss.


@pytest.mark.parametrize(
    ("mode", "bounds", "expected"),
    [
        ("token_mask", dict(cap=2.0), [[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]),  # rho 3 > 2; 0.5 and 0.8 kept at 1
        ("sequence_mask", dict(cap=1.2), [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]),  # products 1.5 > 1.2 and 0.8
        ("icepop", dict(lower=0.6, upper=2.0), [[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]),  # 0.8 kept at 1, not 0.8
        ("geo_rs", dict(lower=0.9, upper=1.2), [[1.0, 1.0, 1.0], [0.0, 0.0, 1.0]]),
        ("kpop", dict(kl_threshold=0.05), [[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]),
    ],
)
def test_the_rejection_of_each_masking_correction_by_hand(mode, bounds, expected):
    close(correction_keep(TRAIN, SAMPLING, MASK, mode, **bounds), expected)
    options = {f"correction_{name}": value for name, value in bounds.items()}
    close(Correction(mode, **options).weights(TRAIN, SAMPLING, MASK, keep_only=True), expected)


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_truncate"])
def test_a_correction_without_a_rejection_has_none_to_give_under_bypass(tiny_model_dir, mode):
    with pytest.raises(ConfigError, match=f"^sampling.correction: {mode} only reweights"):
        correction_keep(TRAIN, SAMPLING, MASK, mode)
    message = (f"^sampling.correction: {mode} with sampling.old_logprobs bypass would weight each token by "
               "pi_theta / pi_rollout twice.*set sampling.old_logprobs to recompute, or sampling.correction to a masking")
    with pytest.raises(ConfigError, match=message):  # refused when the settings are checked, before any fit
        GRPO(model=tiny_model_dir, sampling={"correction": mode, "old_logprobs": "bypass"})
    check_old_logprobs(Correction(mode), "recompute")
    check_old_logprobs(Correction("token_mask"), "bypass")


def test_bypass_weighs_the_gradient_by_the_ratio_once_and_keeps_the_rejection():
    from grpo_lightning.algorithms.surrogates import ppo_clip

    # rho = pi_theta / pi_rollout = 1.1, 0.9, 1.5, 3; A = -1: the PPO loss max(r, clip(r)) has gradient r in
    # logp on every token (1.1 and 0.9 inside [0.8, 1.2], 1.5 and 3 on the unclipped side). token_mask with
    # C = 2 under bypass rejects rho = 3 only: gradients 1.1, 0.9, 1.5, 0 (not r min(r, C) or r^2 1[r <= C]).
    rho = torch.tensor([[1.1, 0.9, 1.5, 3.0]])
    sampling = torch.log(torch.tensor([[0.4, 0.5, 0.2, 0.1]]))
    logp = (sampling + rho.log()).requires_grad_()
    mask = torch.ones(1, 4)
    loss, _ = ppo_clip(logp, sampling, torch.tensor([-1.0]), mask)  # bypass: old = the sampler's
    weighted = correct_policy_loss(loss, logp, sampling, mask, Correction("token_mask", 2.0), Recorder(), keep_only=True)
    (gradient,) = torch.autograd.grad(weighted.sum(), logp)
    close(gradient, [[1.1, 0.9, 1.5, 0.0]])


SHIFT = 0.1  # the sampler's log-probs sit this far below the policy's: every ratio is exp(0.1) = 1.1052 under bypass


def bypass_first_step_loss(make_module, sampling: dict) -> torch.Tensor:
    module = make_module(GRPO, policy={"dtype": "float32"}, sampling={"old_logprobs": "bypass", **sampling},
                         kl={"beta": 0.0}, optim={"ppo_epochs": 2, "micro_batch_size": 4})  # fmt: skip
    torch.manual_seed(0)
    rollout = module.generate({"prompt": ["1+2=", "3+4="]}, module.settings.group_size, module.sampling, with_logprobs=True)
    rollout.sampling_logp = (module.compute_logprobs(module.policy, rollout) - SHIFT) * rollout.completion_mask
    module.compute_old_logprobs(rollout)
    advantages, rows = torch.tensor([1.0, 0.5, 2.0, 1.5] * 2), torch.arange(len(rollout))
    return module.micro_batch_loss(rollout, advantages, rows, len(rows), module.loss_mask(rollout, rows).sum()).detach()


def test_a_masking_correction_under_bypass_adds_its_rejection_not_the_ratio_again(make_module, one_torch_thread):
    uncorrected = bypass_first_step_loss(make_module, {})  # every ratio 1.1052, inside the clip
    assert uncorrected.abs() > 1e-4
    # token_mask (C = 2) and icepop ([0.5, 5]) keep every token at weight 1: the loss of no correction,
    # where weighting by rho again would give exp(0.1) = 1.1052 times it
    for sampling in ({"correction": "token_mask"}, {"correction": "icepop"}):
        torch.testing.assert_close(bypass_first_step_loss(make_module, sampling), uncorrected)
    # icepop in [0.5, 1.05] rejects every token (1.1052 > 1.05): no loss is left
    rejected = bypass_first_step_loss(make_module, {"correction": "icepop", "correction_upper": 1.05})
    assert rejected.item() == 0.0


def test_m2po_chooses_its_mask_over_the_tokens_that_carry_loss(make_module):
    from grpo_lightning.rollout.types import Rollout

    # row 0 ends with EOS, log r = 0.2, 0.2, 0.25, 0.25: (log r)^2 = 0.04, 0.04, 0.0625, 0.0625, running means
    # 0.04, 0.04, 0.0475, 0.0513: tau = 0.04 keeps the first two. Row 1 is truncated (log r = 0) and carries
    # no loss under mask_truncated_completions: counted, its four zeros would bring every running mean
    # under 0.04 (0.0253 for all eight) and keep all of row 0.
    module = make_module(GRPO, configure=False, sampling={"correction": "m2po"}, loss={"mask_truncated_completions": True})
    sampling = torch.full((2, 4), -1.0)
    old = sampling + torch.tensor([[0.2, 0.2, 0.25, 0.25], [0.0, 0.0, 0.0, 0.0]])
    rollout = Rollout(group_size=2, prompt_ids=torch.zeros(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1),
                      completion_ids=torch.zeros(2, 4, dtype=torch.long), completion_mask=torch.ones(2, 4),
                      truncated=torch.tensor([False, True]), prompts=["a", "b"], completions=["", ""],
                      sampling_logp=sampling)  # fmt: skip
    module.compute_logprobs = lambda model, rollout: old  # the old-policy pass
    module.compute_old_logprobs(rollout)
    close(rollout.derived["correction_weights"], [[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])  # 1 outside the loss mask
