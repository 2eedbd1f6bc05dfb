"""OTB, the optimal token baseline: its per-token baseline against hand-worked values, the forward-only
statistics it reads from the policy, and a training step that uses it."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch.testing import assert_close

from grpo_lightning.algorithms.advantages import TokenStatistics, optimal_token_baseline
from grpo_lightning.data import ArithmeticDataModule
from grpo_lightning.models.logprobs import completion_logprobs
from grpo_lightning.models.token_statistics import completion_token_statistics, logprob_and_sum_pi_squared
from grpo_lightning.errors import ConfigError
from grpo_lightning.variants import GRPO, GSPO


def statistics(realized_energy: list, mask: list) -> TokenStatistics:
    """Statistics whose ``w = 1 - 2 pi + sum pi^2`` is ``realized_energy``: ``sum pi^2 = 0.5`` and
    ``pi = (1.5 - w) / 2`` (0.5 for w = 0.5, 0.25 for w = 1)."""
    w = torch.tensor(realized_energy)
    return TokenStatistics(((1.5 - w) / 2).log(), torch.full_like(w, 0.5), torch.tensor(mask))


def test_each_position_gets_the_energy_weighted_mean_return_and_a_lone_tail_none():
    # One group, rewards 1, 0, 0, lengths 3, 1, 2. w: row 0 [.5, 1, .5], row 1 [1], row 2 [.5, .5];
    # W (cumulative): row 0 [.5, 1.5, 2], row 1 [1], row 2 [.5, 1].
    # k = 0: B = (1 * .5) / (.5 + 1 + .5) = 0.25;  k = 1 (rows 0, 2): B = 1.5 / (1.5 + 1) = 0.6;
    # k = 2: row 0 alone (the zero tail): B = 0, A = 1.
    tokens = statistics([[[0.5, 1.0, 0.5], [1.0, 0.5, 0.5], [0.5, 0.5, 0.5]]],
                        [[[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]])  # fmt: skip
    advantages = optimal_token_baseline(torch.tensor([[1.0, 0.0, 0.0]]), tokens)
    expected = torch.tensor([[[0.75, 0.4, 1.0], [-0.25, 0.0, 0.0], [-0.25, -0.6, 0.0]]])
    assert_close(advantages, expected, rtol=1e-6, atol=1e-7)


def test_equal_energies_and_lengths_give_the_group_centred_reward():
    tokens = statistics([[[0.5] * 4] * 3, [[1.0] * 4] * 3], [[[1.0] * 4] * 3] * 2)
    rewards = torch.tensor([[3.0, 0.0, 0.0], [1.0, 2.0, 6.0]])
    expected = (rewards - rewards.mean(1, keepdim=True)).unsqueeze(-1).expand(2, 3, 4)
    assert_close(optimal_token_baseline(rewards, tokens), expected, rtol=1e-6, atol=1e-6)


def test_model_tokens_are_counted_past_an_environments_reply():
    """Multi-turn: row 1's second model token comes after two environment tokens (mask 0), and is
    aligned with row 0's second token, whose k is also 1."""
    tokens = statistics([[[0.5, 1.0, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]]], [[[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0]]])
    # k = 0: W .5, .5: B = .5; k = 1: W 1.5, 1.0: B = 1.5 / 2.5 = 0.6.
    advantages = optimal_token_baseline(torch.tensor([[1.0, 0.0]]), tokens)
    assert_close(advantages, torch.tensor([[[0.5, 0.4, 0.0, 0.0], [-0.5, 0.0, 0.0, -0.6]]]), rtol=1e-6, atol=1e-7)


def test_sum_pi_squared_from_logits_by_hand():
    # softmax([0, ln 3]) = [1/4, 3/4]: sum pi^2 = 10/16; at temperature 2, pi ~ [1, sqrt 3]: 4 / (1 + sqrt 3)^2.
    logits, target = torch.tensor([[0.0, math.log(3.0)]]), torch.tensor([1])
    logp, squares = logprob_and_sum_pi_squared(logits, target)
    assert_close(logp, torch.tensor([math.log(0.75)]))
    assert_close(squares, torch.tensor([10 / 16]))
    logp, squares = logprob_and_sum_pi_squared(logits, target, temperature=2.0)
    assert_close(logp, torch.tensor([math.log(3**0.5 / (1 + 3**0.5))]))
    assert_close(squares, torch.tensor([4 / (1 + 3**0.5) ** 2]))


def test_the_policys_statistics_match_its_log_probs_and_an_unpadded_softmax(make_module, make_rollout, one_torch_thread):
    module = make_module(GRPO, sampling={"group_size": 2, "max_new_tokens": 6, "temperature": 0.7})
    rollout = make_rollout(module, ["1+2=", "12+30="])
    inputs = rollout.model_inputs(torch.arange(len(rollout)))
    logp, squares = completion_token_statistics(module.policy, *inputs, temperature=0.7)
    reference, _ = completion_logprobs(module.policy, *inputs, temperature=0.7, with_entropy=False)
    assert_close(logp, reference, rtol=1e-4, atol=1e-5)
    for row in range(len(rollout)):  # one row, no padding at all
        prompt = rollout.prompt_ids[row][rollout.prompt_mask[row].bool()]
        completion = rollout.completion_ids[row][rollout.completion_mask[row].bool()]
        logits = module.policy(torch.cat([prompt, completion])[None]).logits[0, len(prompt) - 1 : -1] / 0.7
        want = torch.softmax(logits.double(), -1).pow(2).sum(-1).float()
        assert_close(squares[row, : len(completion)], want, rtol=1e-4, atol=1e-6)
        assert not squares[row, len(completion) :].any()


def test_a_fit_step_trains_on_per_token_advantages(tiny_model_dir, tmp_path, one_torch_thread):
    module = GRPO(model=tiny_model_dir, advantage="optimal_token_baseline", sampling={"group_size": 3, "max_new_tokens": 6},
                  rewards={"funcs": ["tests.helpers.length_parity_reward"]}, optim={"micro_batch_size": 4})  # fmt: skip
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False, limit_val_batches=0,
                        enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(module, ArithmeticDataModule(num_train=8, num_val=2, batch_size=2))
    rollout, advantages = module.last_rollout, module.last_advantages
    assert advantages.shape == rollout.completion_ids.shape  # [N, T]
    tokens = TokenStatistics(*(t.view(2, 3, -1) for t in (rollout.derived["token_logp"],
                             rollout.derived["sum_pi_squared"], rollout.completion_mask)))  # fmt: skip
    assert torch.equal(advantages, optimal_token_baseline(rollout.rewards.view(2, 3), tokens).flatten(0, 1))
    assert advantages.abs().sum() > 0 and module.last_step_metrics["grad_norm"] > 0


def test_a_per_sequence_surrogate_is_refused_naming_the_advantage():
    with pytest.raises(ConfigError, match=r"^advantage: optimal_token_baseline's advantages are per token.*ppo_clip"):
        GSPO("m", advantage="optimal_token_baseline")
