"""PPO's math (``grpo_lightning.algorithms.gae``) by hand: token rewards, GAE, whitening, the clipped
value loss and the explained variance. Hand values are worked out in the comments next to them; the
PPO preset that uses them is tests/variants/test_ppo.py."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from grpo_lightning.algorithms import gae as G


def t(values):
    return torch.tensor(values, dtype=torch.float64)


def test_token_rewards_put_the_score_at_the_last_token_and_the_kl_penalty_everywhere():
    mask = t([[1, 1, 1, 1], [1, 1, 0, 0]])
    kl = t([[0, 0, 0, 0], [1, 0, 5, 5]])  # what lies under the padding is ignored
    rewards = G.token_rewards(t([1.0, 2.0]), kl, mask, beta=0.1)
    # row 1: the score 1 at token 3; row 2 (two tokens): -0.1 * 1 at token 0, the score 2 at token 1.
    assert_close(rewards, t([[0, 0, 0, 1.0], [-0.1, 2.0, 0, 0]]))
    assert_close(G.token_rewards(t([1.0, 2.0]), None, mask, beta=0.1), t([[0, 0, 0, 1.0], [0, 2.0, 0, 0]]))


def test_gae_on_hand_made_trajectories_with_a_shorter_masked_row():
    rewards = t([[0, 0, 0, 1.0], [-0.1, 2.0, 0, 0]])
    values = t([[0.5, 0.6, 0.7, 0.8], [1.0, 1.5, 9.0, 9.0]])  # 9: under the padding, ignored
    mask = t([[1, 1, 1, 1], [1, 1, 0, 0]])
    advantages, returns = G.gae(rewards, values, mask, gamma=1.0, lam=0.95)
    # row 1: delta_3 = 1 + 0 - 0.8 = 0.2 (terminal after the last token)    A_3 = 0.2
    #        delta_2 = 0 + 0.8 - 0.7 = 0.1      A_2 = 0.1 + 0.95 * 0.2    = 0.29
    #        delta_1 = 0 + 0.7 - 0.6 = 0.1      A_1 = 0.1 + 0.95 * 0.29   = 0.3755
    #        delta_0 = 0 + 0.6 - 0.5 = 0.1      A_0 = 0.1 + 0.95 * 0.3755 = 0.456725
    # row 2: delta_1 = 2 + 0 - 1.5 = 0.5        A_1 = 0.5
    #        delta_0 = -0.1 + 1.5 - 1.0 = 0.4   A_0 = 0.4 + 0.95 * 0.5    = 0.875
    assert_close(advantages, t([[0.456725, 0.3755, 0.29, 0.2], [0.875, 0.5, 0, 0]]))
    # R = A + V on the tokens, 0 on the padding.
    assert_close(returns, t([[0.956725, 0.9755, 0.99, 1.0], [1.875, 2.0, 0, 0]]))


def test_gae_with_lambda_1_returns_the_reward_to_go_and_with_lambda_0_the_one_step_target():
    rewards, values, mask = t([[0, 0, 0, 1.0], [-0.1, 2.0, 0, 0]]), t([[0.5, 0.6, 0.7, 0.8], [1.0, 1.5, 9, 9]]), t([[1] * 4, [1, 1, 0, 0]])
    _, monte_carlo = G.gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert_close(monte_carlo, t([[1, 1, 1, 1.0], [1.9, 2.0, 0, 0]]))
    _, one_step = G.gae(rewards, values, mask, gamma=1.0, lam=0.0)  # R_t = r_t + V_{t+1}
    assert_close(one_step, t([[0.6, 0.7, 0.8, 1.0], [1.4, 2.0, 0, 0]]))


def test_whitening_uses_the_valid_tokens_of_the_whole_batch():
    x, mask = t([[1, 2, 3], [4, 99, 99]]), t([[1, 1, 1], [1, 0, 0]])
    # valid entries 1, 2, 3, 4: mean 2.5, biased variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25
    s = math.sqrt(1.25)
    assert_close(G.whiten(x, mask, eps=0.0), t([[-1.5 / s, -0.5 / s, 0.5 / s], [1.5 / s, 0, 0]]))


def test_clipped_value_loss_by_hand_with_and_without_the_clip_binding():
    old, returns = t([[1.0, 1.0, 1.0]]), t([[2.0, 2.0, 2.0]])
    values = t([[1.1, 1.5, 0.5]]).requires_grad_()
    loss, clipped = G.clipped_value_loss(values, old, returns, clip=0.2)
    # V = 1.1, inside 1 +- 0.2: both terms (1.1 - 2)^2 = 0.81 -> 0.405.
    # V = 1.5, outside, towards R: (1.5 - 2)^2 = 0.25 < (1.2 - 2)^2 = 0.64 -> the clip binds, 0.32.
    # V = 0.5, outside, away from R: (0.5 - 2)^2 = 2.25 > (0.8 - 2)^2 = 1.44 -> unclipped, 1.125.
    assert_close(loss, t([[0.405, 0.32, 1.125]]))
    assert clipped.tolist() == [[False, True, False]]
    (grad,) = torch.autograd.grad(loss.sum(), values)
    assert_close(grad, t([[1.1 - 2, 0.0, 0.5 - 2]]))  # V - R, 0 where the clip binds
    plain, never = G.clipped_value_loss(values, old, returns, clip=None)
    assert_close(plain, t([[0.405, 0.125, 1.125]]))
    assert not never.any()
    with pytest.raises(ValueError, match="clip must be positive"):
        G.clipped_value_loss(values, old, returns, clip=0.0)


def test_explained_variance_by_hand():
    returns, mask = t([[1, 2, 3], [4, 7, 7]]), t([[1, 1, 1], [1, 0, 0]])
    # R - V = 0, 0, 0, -1: variance 0.1875 (mean -0.25); Var[R] = 1.25 -> 1 - 0.1875 / 1.25 = 0.85.
    assert_close(G.explained_variance(t([[1, 2, 3], [5, 0, 0]]), returns, mask).double(), t(0.85))
    assert G.explained_variance(returns, returns, mask) == 1.0
    assert G.explained_variance(torch.full_like(returns, 3.0), returns, mask) == 0.0  # the mean is no better
    assert G.explained_variance(returns, torch.ones_like(returns), mask).isnan()  # nothing to explain
