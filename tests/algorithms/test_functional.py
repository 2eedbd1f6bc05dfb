"""Specification tests for grpo_lightning.algorithms.functional and grpo_lightning.algorithms.policy_losses.

Expected values are worked out by hand in the comments next to them.
"""

import pytest
import torch
from torch.testing import assert_close

from grpo_lightning.algorithms import functional as F
from grpo_lightning.algorithms import policy_losses

f64 = torch.float64


def t(values, dtype=f64):
    return torch.tensor(values, dtype=dtype)


def grad_of(scalar, leaf):
    (g,) = torch.autograd.grad(scalar, leaf)
    return g


# --------------------------------------------------------------------------- GRPO


def test_group_normalized_uses_unbiased_std_and_eps():
    # group [1,0,0,1]: mean 0.5, deviations +-0.5, unbiased var = 4*0.25/3 = 1/3,
    # std = sqrt(1/3) = 0.57735027; 0.5 / (0.57735027 + 1e-4) = 0.86587543
    adv = F.group_normalized_advantages(t([[1.0, 0.0, 0.0, 1.0]]))
    a = 0.8658754297607016
    assert_close(adv, t([[a, -a, -a, a]]))


def test_group_normalized_without_eps_is_plain_z_score():
    # 0.5 / sqrt(1/3) = sqrt(3)/2
    adv = F.group_normalized_advantages(t([[1.0, 0.0, 0.0, 1.0]]), eps=0.0)
    a = 0.8660254037844386
    assert_close(adv, t([[a, -a, -a, a]]))


def test_group_normalized_is_exactly_zero_for_equal_groups():
    # 0.1 is not representable, so a naive mean could leave tiny residuals.
    rewards = t([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0], [0.1, 0.1, 0.1, 0.1]])
    adv = F.group_normalized_advantages(rewards, eps=0.0)
    assert torch.equal(adv[1:], torch.zeros(2, 4, dtype=f64))
    assert not adv.isnan().any()


@pytest.mark.parametrize("fn", [F.group_normalized_advantages, F.leave_one_out_advantages])
def test_single_completion_groups_are_rejected(fn):
    with pytest.raises(ValueError, match="G >= 2"):
        fn(torch.ones(3, 1))


# ----------------------------------------------------------------------- Dr. GRPO


def test_group_centered_subtracts_group_mean_only():
    # [1,0,0,1] - 0.5 ; [3,1,2,2] - 2 ; equal group -> 0
    rewards = t([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0], [0.1, 0.1, 0.1, 0.1]])
    adv = F.group_centered_advantages(rewards)
    expected = t([[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert_close(adv, expected)
    assert torch.equal(adv[2], torch.zeros(4, dtype=f64))


# --------------------------------------------------------------------------- RLOO


def test_leave_one_out_baseline_excludes_the_sample_itself():
    # [1,0,0,1]: 1 - (0+0+1)/3 = 2/3 ; 0 - (1+0+1)/3 = -2/3   (= 4/3 * (r - 0.5))
    # [3,1,2]:   3 - (1+2)/2 = 1.5 ; 1 - (3+2)/2 = -1.5 ; 2 - (3+1)/2 = 0
    adv4 = F.leave_one_out_advantages(t([[1.0, 0.0, 0.0, 1.0]]))
    adv3 = F.leave_one_out_advantages(t([[3.0, 1.0, 2.0]]))
    assert_close(adv4, t([[2 / 3, -2 / 3, -2 / 3, 2 / 3]]))
    assert_close(adv3, t([[1.5, -1.5, 0.0]]))


def test_leave_one_out_is_exactly_zero_for_equal_groups():
    adv = F.leave_one_out_advantages(t([[0.1, 0.1, 0.1], [0.0, 0.0, 0.0]]))
    assert torch.equal(adv, torch.zeros(2, 3, dtype=f64))


@pytest.mark.parametrize(
    "fn",
    [F.group_normalized_advantages, F.group_centered_advantages, F.leave_one_out_advantages],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_advantages_keep_dtype_and_never_nan(fn, dtype):
    rewards = torch.tensor([[1.0, 0.0, 1.0], [0.3, 0.3, 0.3], [0.0, 0.0, 0.0]], dtype=dtype)
    adv = fn(rewards)
    assert adv.dtype == dtype and adv.shape == (3, 3)
    assert not adv.isnan().any()
    assert torch.equal(adv[1:], torch.zeros(2, 3, dtype=dtype))


def test_integer_rewards_give_float_advantages():
    adv = F.group_centered_advantages(torch.tensor([[1, 0]]))
    assert adv.is_floating_point()
    assert_close(adv, torch.tensor([[0.5, -0.5]]))


# ------------------------------------------------------------------ DAPO filtering


def test_informative_groups_flags_groups_with_reward_spread():
    rewards = t([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [2.0, 2.0, 3.0]])
    mask = F.informative_groups(rewards)
    assert mask.dtype == torch.bool
    assert mask.tolist() == [False, True, False, True]


# ---------------------------------------------------------------- DAPO overlong


def test_overlong_penalty_is_zero_up_to_buffer_start_then_linear_then_clamped():
    # L = 10, B = 4 -> punishment starts after 6 tokens; slope 1/4 per token
    lengths = torch.tensor([0, 6, 7, 8, 10, 11, 100])
    pen = F.overlong_penalty(lengths, max_new_tokens=10, buffer=4)
    assert_close(pen, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]))


def test_overlong_penalty_scales_with_penalty_factor():
    pen = F.overlong_penalty(torch.tensor([6, 8, 10, 12]), 10, 4, penalty_factor=0.5)
    assert_close(pen, torch.tensor([0.0, -0.25, -0.5, -0.5]))


def test_overlong_penalty_buffer_may_equal_max_new_tokens():
    # L = B = 4: starts at 0; len 2 -> -2/4
    pen = F.overlong_penalty(torch.tensor([0, 2, 4]), max_new_tokens=4, buffer=4)
    assert_close(pen, torch.tensor([0.0, -0.5, -1.0]))


def test_overlong_penalty_keeps_float_length_dtype():
    pen = F.overlong_penalty(t([7.0]), 10, 4)
    assert pen.dtype == f64
    assert_close(pen, t([-0.25]))


@pytest.mark.parametrize("buffer", [0, -1, 11])
def test_overlong_penalty_rejects_buffer_outside_0_to_max(buffer):
    with pytest.raises(ValueError, match="buffer"):
        F.overlong_penalty(torch.tensor([5]), max_new_tokens=10, buffer=buffer)


# --------------------------------------------------------------- clipped surrogate

RATIOS = [0.5, 0.9, 1.0, 1.1, 1.25, 2.0]


def _surrogate_at(ratios, advantage, eps_low, eps_high):
    logp = torch.log(t([ratios])).requires_grad_()
    old = torch.zeros_like(logp)
    loss, low, high = policy_losses.clipped_surrogate(logp, old, t([advantage]), eps_low, eps_high)
    return loss, low, high, grad_of(loss.sum(), logp)


def test_clipped_surrogate_positive_advantage_clips_above_only():
    # A = 2, eps 0.2: -min(rho*2, clip(rho, 0.8, 1.2)*2)
    #   0.5 -> -min(1.0, 1.6) = -1.0 (not clipped: gradient -A*rho = -1.0)
    #   1.25 -> -min(2.5, 2.4) = -2.4 ; 2.0 -> -min(4.0, 2.4) = -2.4 (clipped)
    loss, low, high, grad = _surrogate_at(RATIOS, 2.0, 0.2, 0.2)
    assert_close(loss, t([[-1.0, -1.8, -2.0, -2.2, -2.4, -2.4]]))
    assert low.tolist() == [[False] * 6]
    assert high.tolist() == [[False, False, False, False, True, True]]
    assert_close(grad, t([[-1.0, -1.8, -2.0, -2.2, 0.0, 0.0]]))


def test_clipped_surrogate_negative_advantage_clips_below_only():
    # A = -2, eps 0.2: -min(-2 rho, -2 clip(rho)) = 2 max(rho, clip(rho, 0.8, 1.2))
    #   0.5 -> 2 * 0.8 = 1.6 (clipped) ; 1.25 -> 2.5 ; 2.0 -> 4.0 (not clipped)
    loss, low, high, grad = _surrogate_at(RATIOS, -2.0, 0.2, 0.2)
    assert_close(loss, t([[1.6, 1.8, 2.0, 2.2, 2.5, 4.0]]))
    assert low.tolist() == [[True, False, False, False, False, False]]
    assert high.tolist() == [[False] * 6]
    # unclipped gradient: -A * rho = 2 rho
    assert_close(grad, t([[0.0, 1.8, 2.0, 2.2, 2.5, 4.0]]))


def test_clip_higher_lets_ratio_1_25_through_with_eps_high_0_28():
    loss, _, high, grad = _surrogate_at([1.25], 1.0, 0.2, 0.2)
    assert_close(loss, t([[-1.2]]))
    assert high.item() is True
    assert grad.item() == 0.0

    loss, _, high, grad = _surrogate_at([1.25], 1.0, 0.2, 0.28)
    assert_close(loss, t([[-1.25]]))
    assert high.item() is False
    assert_close(grad, t([[-1.25]]))


def test_clipped_surrogate_broadcasts_sequence_advantage_over_tokens():
    logp = torch.zeros(2, 3, dtype=f64)  # rho = 1 everywhere -> loss = -A
    loss, low, high = policy_losses.clipped_surrogate(logp, logp, t([1.0, -3.0]), 0.2, 0.2)
    assert_close(loss, t([[-1.0, -1.0, -1.0], [3.0, 3.0, 3.0]]))
    assert low.shape == high.shape == (2, 3)
    assert low.dtype == high.dtype == torch.bool


def test_clipped_surrogate_rejects_negative_clip_range():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError):
        policy_losses.clipped_surrogate(x, x, torch.zeros(1), -0.1, 0.2)


# ------------------------------------------------------------ GSPO surrogate


def _gspo_case():
    # per-token log ratios (padding values are garbage on purpose)
    deltas = t(
        [
            [0.1, 0.3, 5.0],  # mean 0.2 -> s = e^0.2 = 1.22140, A = 1: inside [0.8, 1.28]
            [-0.5, -0.5, -0.5],  # s = e^-0.5 = 0.60653, A = -1: clipped low -> loss 0.8
            [0.4, -9.0, 7.0],  # |y| = 1, s = e^0.4 = 1.49182, A = 2: clipped high -> -2.56
            [3.0, 3.0, 3.0],  # empty row: s = 1, A = 3 -> loss -3
            [0.3, -0.3, 0.0],  # s = 1, A = -1 -> loss 1
        ]
    )
    mask = t([[1, 1, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 1]])
    adv = t([1.0, -1.0, 2.0, 3.0, -1.0])
    logp = deltas.clone().requires_grad_()
    old = torch.zeros_like(deltas)
    return logp, old, adv, mask


def test_sequence_clipped_surrogate_values_and_flags():
    logp, old, adv, mask = _gspo_case()
    loss, low, high = policy_losses.sequence_clipped_surrogate(logp, old, adv, mask, 0.2, 0.28)
    expected_seq = t([-1.2214027581601699, 0.8, -2.56, -3.0, 1.0])
    assert_close(loss[:, 0], expected_seq)
    assert low[:, 0].tolist() == [False, True, False, False, False]
    assert high[:, 0].tolist() == [False, False, True, False, False]
    assert not loss.isnan().any()


def test_sequence_clipped_surrogate_broadcasts_to_every_token():
    logp, old, adv, mask = _gspo_case()
    loss, low, high = policy_losses.sequence_clipped_surrogate(logp, old, adv, mask, 0.2, 0.28)
    assert loss.shape == low.shape == high.shape == (5, 3)
    assert torch.equal(loss, loss[:, :1].expand(5, 3))
    assert torch.equal(low, low[:, :1].expand(5, 3))
    assert torch.equal(high, high[:, :1].expand(5, 3))
    # per-sequence token mean recovers the sequence loss on every non-empty row
    assert_close(F.masked_mean(loss, mask, dim=-1)[[0, 1, 2, 4]], loss[[0, 1, 2, 4], 0])


def test_sequence_clipped_surrogate_gradient_is_minus_a_s_over_length():
    # d loss_i / d logp_{i,t} = -A_i s_i / |y_i| on real tokens when unclipped, else 0
    logp, old, adv, mask = _gspo_case()
    loss, _, _ = policy_losses.sequence_clipped_surrogate(logp, old, adv, mask, 0.2, 0.28)
    grad = grad_of(loss[:, 0].sum(), logp)
    g0 = -1.2214027581601699 / 2  # -A s / |y| = -e^0.2 / 2
    expected = t(
        [
            [g0, g0, 0.0],
            [0.0, 0.0, 0.0],  # clipped
            [0.0, 0.0, 0.0],  # clipped
            [0.0, 0.0, 0.0],  # empty
            [1 / 3, 1 / 3, 1 / 3],  # -(-1) * 1 / 3
        ]
    )
    assert_close(grad, expected)


def test_sequence_clipped_surrogate_rejects_wrong_advantage_count():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="one value per row"):
        policy_losses.sequence_clipped_surrogate(x, x, torch.zeros(3), torch.ones(2, 3), 0.2, 0.2)


# ------------------------------------------------------------------------- KL


def _kl_case():
    # d = ref - logp = [-1, 0, 2]
    return t([[0.0, -1.0, -2.0]]), t([[-1.0, -1.0, 0.0]])


def test_kl_k1_is_log_ratio():
    logp, ref = _kl_case()
    assert_close(F.kl_k1(logp, ref), t([[1.0, 0.0, -2.0]]))


def test_kl_k2_is_half_squared_log_ratio():
    logp, ref = _kl_case()
    assert_close(F.kl_k2(logp, ref), t([[0.5, 0.0, 2.0]]))


def test_kl_k3_matches_hand_values():
    # e^-1 - (-1) - 1 = 0.36787944 ; 0 ; e^2 - 2 - 1 = 4.38905610
    logp, ref = _kl_case()
    assert_close(F.kl_k3(logp, ref), t([[0.36787944117144233, 0.0, 4.38905609893065]]))


def test_kl_k3_is_non_negative():
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(64, 32, generator=gen) * 3
    ref = torch.randn(64, 32, generator=gen) * 3
    near = logp + 1e-7 * torch.randn(64, 32, generator=gen)  # cancellation regime
    assert (F.kl_k3(logp, ref) >= 0).all()
    assert (F.kl_k3(logp, near) >= 0).all()


@pytest.mark.parametrize("name", F.KL_ESTIMATORS)
def test_kl_estimators_vanish_when_policies_match(name):
    logp = torch.randn(4, 5)
    assert torch.equal(F.kl_estimate(logp, logp.clone(), name), torch.zeros(4, 5))


def test_kl_estimate_dispatches_by_name():
    logp, ref = _kl_case()
    assert F.KL_ESTIMATORS == ("k1", "k2", "k3")
    assert torch.equal(F.kl_estimate(logp, ref, "k1"), F.kl_k1(logp, ref))
    assert torch.equal(F.kl_estimate(logp, ref, "k2"), F.kl_k2(logp, ref))
    assert torch.equal(F.kl_estimate(logp, ref, "k3"), F.kl_k3(logp, ref))


def test_kl_estimate_rejects_unknown_name_listing_choices():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="k1, k2, k3"):
        F.kl_estimate(x, x, "k4")


# ------------------------------------------------------------------ masked helpers


def test_masked_sum_and_mean_ignore_padding_and_are_zero_safe():
    x = t([[1.0, 2.0, float("nan")], [4.0, float("inf"), 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    assert_close(F.masked_sum(x, mask), t(7.0))
    assert_close(F.masked_mean(x, mask), t(7.0 / 3))
    assert_close(F.masked_sum(x, mask, dim=-1), t([3.0, 4.0, 0.0]))
    assert_close(F.masked_mean(x, mask, dim=-1), t([1.5, 4.0, 0.0]))
    assert_close(F.masked_mean(x, torch.zeros_like(mask)), t(0.0))


def test_the_mean_absolute_advantage_of_per_token_advantages_leaves_the_padding_out():
    """Lengths 1 and 4 padded to 4: 0.2 over the 5 tokens, not 0.125 over the 8 slots."""
    advantages = t([[0.5, 0.0, 0.0, 0.0], [-0.125, -0.125, -0.125, -0.125]])
    mask = t([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    assert_close(F.mean_abs_advantage(advantages, mask), t(1.0 / 5))
    assert_close(F.mean_abs_advantage(t([1.0, -3.0]), mask), t(2.0))  # one per completion


# ---------------------------------------------------------------- aggregations

# Ragged batch: rows of 4, 2, 1 and 0 real tokens; padding holds garbage.
RAGGED_LOSS = [
    [1.0, 2.0, 3.0, 4.0],
    [5.0, 6.0, 100.0, 100.0],
    [7.0, 100.0, 100.0, 100.0],
    [9.0, 9.0, 9.0, 9.0],
]
RAGGED_MASK = [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
# masked row sums 10, 11, 7, 0 -> total 28 over 7 tokens and 4 sequences


def test_token_mean_divides_by_real_token_count():
    assert_close(F.token_mean(t(RAGGED_LOSS), t(RAGGED_MASK)), t(28 / 7))


def test_sequence_mean_token_mean_averages_per_sequence_means():
    # row means 2.5, 5.5, 7, 0 (empty) -> 15 / 4
    assert_close(F.sequence_mean_token_mean(t(RAGGED_LOSS), t(RAGGED_MASK)), t(3.75))


def test_sequence_mean_token_sum_averages_per_sequence_sums():
    assert_close(F.sequence_mean_token_sum(t(RAGGED_LOSS), t(RAGGED_MASK)), t(28 / 4))


def test_constant_normalized_sum_uses_sequences_times_max_tokens():
    # 28 / (4 * 8)
    assert_close(F.constant_normalized_sum(t(RAGGED_LOSS), t(RAGGED_MASK), 8), t(0.875))


def test_explicit_counts_override_the_local_ones():
    loss, mask = t(RAGGED_LOSS), t(RAGGED_MASK)
    assert_close(F.token_mean(loss, mask, num_tokens=14), t(2.0))
    assert_close(F.sequence_mean_token_mean(loss, mask, num_sequences=10), t(1.5))
    assert_close(F.sequence_mean_token_sum(loss, mask, num_sequences=8), t(3.5))
    assert_close(F.constant_normalized_sum(loss, mask, 7, num_sequences=2), t(2.0))
    assert_close(F.token_mean(loss, mask, num_tokens=torch.tensor(28)), t(1.0))


def test_constant_normalized_sum_rejects_non_positive_max_tokens():
    with pytest.raises(ValueError, match="max_tokens"):
        F.constant_normalized_sum(t(RAGGED_LOSS), t(RAGGED_MASK), 0)


AGGREGATIONS = {
    "token_mean": lambda loss, mask, n_tok, n_seq: F.token_mean(loss, mask, num_tokens=n_tok),
    "sequence_mean_token_mean": lambda loss, mask, n_tok, n_seq: F.sequence_mean_token_mean(
        loss, mask, num_sequences=n_seq
    ),
    "sequence_mean_token_sum": lambda loss, mask, n_tok, n_seq: F.sequence_mean_token_sum(
        loss, mask, num_sequences=n_seq
    ),
    "constant_normalized_sum": lambda loss, mask, n_tok, n_seq: F.constant_normalized_sum(
        loss, mask, 8, num_sequences=n_seq
    ),
}


@pytest.mark.parametrize("name", list(AGGREGATIONS))
@pytest.mark.parametrize("mask_dtype", [f64, torch.bool])
def test_aggregations_of_an_empty_batch_are_zero_not_nan(name, mask_dtype):
    loss = torch.randn(3, 4, dtype=f64)
    mask = torch.zeros(3, 4, dtype=mask_dtype)
    out = AGGREGATIONS[name](loss, mask, None, None)
    assert out.item() == 0.0


@pytest.mark.parametrize("name", list(AGGREGATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_aggregations_keep_loss_dtype(name, dtype):
    out = AGGREGATIONS[name](t(RAGGED_LOSS, dtype), t(RAGGED_MASK, dtype), None, None)
    assert out.dtype == dtype and out.dim() == 0 and not out.isnan()


def _micro_batch_case():
    gen = torch.Generator().manual_seed(1)
    n, length = 7, 6
    lengths = torch.tensor([6, 1, 0, 4, 3, 6, 2])
    mask = (torch.arange(length) < lengths.unsqueeze(1)).to(f64)
    logp = (-torch.rand(n, length, generator=gen, dtype=f64)).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(n, length, generator=gen, dtype=f64)
    adv = torch.randn(n, generator=gen, dtype=f64)
    return logp, old, adv, mask


SPLITS = [(0, 2), (2, 5), (5, 7)]

SURROGATES = {
    "token": lambda logp, old, adv, mask: policy_losses.clipped_surrogate(logp, old, adv, 0.2, 0.28)[0],
    "sequence": lambda logp, old, adv, mask: policy_losses.sequence_clipped_surrogate(
        logp, old, adv, mask, 0.2, 0.28
    )[0],
}


@pytest.mark.parametrize("surrogate", list(SURROGATES))
@pytest.mark.parametrize("name", list(AGGREGATIONS))
def test_micro_batches_with_batch_counts_sum_to_the_whole_batch(name, surrogate):
    agg, loss_fn = AGGREGATIONS[name], SURROGATES[surrogate]
    logp, old, adv, mask = _micro_batch_case()
    n_tok, n_seq = mask.sum(), mask.shape[0]

    whole = agg(loss_fn(logp, old, adv, mask), mask, None, None)
    whole_grad = grad_of(whole, logp)

    parts = sum(
        agg(loss_fn(logp[a:b], old[a:b], adv[a:b], mask[a:b]), mask[a:b], n_tok, n_seq)
        for a, b in SPLITS
    )
    parts_grad = grad_of(parts, logp)

    assert_close(parts, whole)
    assert_close(parts_grad, whole_grad)
    assert whole_grad.abs().sum() > 0


# ----------------------------------------------------------------- precision / NaN


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_surrogates_and_kl_keep_dtype_and_handle_empty_rows(dtype):
    logp = torch.full((2, 3), -1.0, dtype=dtype)
    ref = torch.full((2, 3), -1.5, dtype=dtype)
    adv = torch.tensor([1.0, -1.0], dtype=dtype)
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    outs = [
        policy_losses.clipped_surrogate(logp, ref, adv, 0.2, 0.28)[0],
        policy_losses.sequence_clipped_surrogate(logp, ref, adv, mask, 0.2, 0.28)[0],
        *(F.kl_estimate(logp, ref, name) for name in F.KL_ESTIMATORS),
    ]
    for out in outs:
        assert out.dtype == dtype and out.shape == (2, 3)
        assert not out.isnan().any()

