"""Micro-batches packed to a token budget: the packing by hand, the row order of a pass's results,
and the settings that choose between a row count and a token budget; a fit's optimizer step takes
the same gradient in any micro-batches, with the LM head fused or not, packed or padded."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.testing import assert_close

from grpo_lightning.rollout.engine.options import EngineOptions
from grpo_lightning.training.micro_batches import fewest_micro_batches, in_row_order, pack_rows, token_budget_split
from grpo_lightning.errors import ConfigError
from grpo_lightning.variants import GRPO, PPO, OnlineDPOGRPO
from tests.helpers import GradientCapture, arithmetic, cpu_trainer


def test_rows_go_longest_first_to_the_micro_batch_of_least_squared_tokens_with_room():
    # Budget 12, 28 tokens: 3 micro-batches. 10 -> #0; 7 -> #1 (17 > 12 in #0); 6 -> #2 (13 > 12 in #1);
    # 3 -> #2 (sum L^2: 100, 49, 36); 2 -> #2 (100, 49, 45), which then holds 6 + 3 + 2 = 11 tokens.
    lengths = [10, 3, 7, 2, 6]
    assert fewest_micro_batches(lengths, 12) == 3
    assert pack_rows(lengths, 12, 3) == ([[0], [2], [1, 3, 4]], True)


def test_more_micro_batches_are_taken_until_every_row_fits():
    # 4 + 4 + 4 + 3 = 15 tokens, budget 8: two micro-batches would do by sum, but 4 + 4 leaves 3 and 4
    # with room for one 4 only: 4 -> #0, 4 -> #1, 4 -> #0 (8), 3 -> #1 (7). Budget 7: 4 + 3 only, so three.
    assert pack_rows([4, 4, 4, 3], 8, 2) == ([[0, 2], [1, 3]], True)
    assert pack_rows([4, 4, 4, 3], 7, 2)[1] is False
    assert fewest_micro_batches([4, 4, 4, 3], 7) == 3


def test_a_row_over_the_budget_is_a_micro_batch_of_its_own():
    # 20 counts as 8 toward the first guess: ceil((8 + 3 + 4) / 8) = 2 micro-batches, [20] and [3, 4].
    rows = torch.tensor([5, 9, 2])
    assert [part.tolist() for part in token_budget_split(rows, [20, 3, 4], 8)] == [[5], [9, 2]]


def test_results_of_micro_batches_in_any_order_come_back_in_row_order():
    micro_batches = [torch.tensor([3, 0]), torch.tensor([2]), torch.tensor([1, 4])]
    parts = [torch.tensor([[30.0], [0.0]]), torch.tensor([[20.0]]), torch.tensor([[10.0], [40.0]])]
    assert in_row_order(parts, micro_batches).flatten().tolist() == [0.0, 10.0, 20.0, 30.0, 40.0]


@pytest.mark.parametrize(
    "optim, message",
    [
        ({"micro_batch_tokens": 512}, r"^optim.micro_batch_tokens: .*--model.optim.micro_batch_size null"),
        ({"micro_batch_size": None}, r"^optim.micro_batch_size: null needs optim.micro_batch_tokens"),
        ({"micro_batch_size": None, "micro_batch_tokens": 0}, r"^optim.micro_batch_tokens: must be at least 1"),
    ],
)
def test_one_of_a_row_count_and_a_token_budget_names_the_micro_batches(optim, message):
    with pytest.raises(ConfigError, match=message):
        GRPO("m", optim=optim)


def test_a_token_budget_runs_where_a_variants_own_passes_take_it_and_is_refused_elsewhere():
    budget = {"micro_batch_size": None, "micro_batch_tokens": 512, "minibatch_size": 4}
    assert GRPO("m", optim=budget).optim_options.micro_batch_tokens == 512
    assert PPO("m", optim=budget).optim_options.micro_batch_tokens == 512  # its critic's passes too
    with pytest.raises(ConfigError, match=r"^optim.micro_batch_tokens: does not apply to OnlineDPOGRPO"):
        OnlineDPOGRPO("m", optim=budget)


def test_a_log_prob_pass_on_a_token_budget_gives_the_row_counts_log_probs(make_module, make_rollout, one_torch_thread):
    module = make_module(GRPO, optim={"micro_batch_size": 3})
    rollout = make_rollout(module, ["12+34=", "5+6=", "77+8="])
    rows = module.compute_logprobs(module.policy, rollout)
    module.optim_options = type(module.optim_options)(micro_batch_size=None, micro_batch_tokens=40)
    split = module.micro_batches(rollout, torch.arange(len(rollout)))
    assert 1 < len(split) < len(rollout)
    assert any((part.diff() > 1).any() for part in split)  # not the row count's contiguous runs
    torch.testing.assert_close(module.compute_logprobs(module.policy, rollout), rows, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ a fit's optimizer step


def test_trainer_step_gradient_does_not_depend_on_micro_batching_the_fused_head_or_packing(make_module):
    # 2 prompts x 4 completions = 8 rows: micro-batches of 3 + 3 + 2 (or packed to 40 tokens, about two
    # rows) against one of 8, with the LM head fused into the log-softmax and without, packed without padding and padded.
    gradients = []
    tokens = {"micro_batch_size": None, "micro_batch_tokens": 40}
    settings = (({"micro_batch_size": 3}, True, False), ({"micro_batch_size": 8}, True, False),
                ({"micro_batch_size": 3}, False, True), (tokens, True, False), ({"micro_batch_size": 8}, True, True),
                ({"micro_batch_size": 8}, False, False))  # fmt: skip
    for optim, fused_lm_head, padding_free in settings:
        L.seed_everything(0)
        capture = GradientCapture()
        engine = EngineOptions(fused_lm_head=fused_lm_head, padding_free=padding_free)
        module = make_module(GRPO, configure=False, engine=engine, optim=optim)
        cpu_trainer(max_steps=1, callbacks=[capture]).fit(module, datamodule=arithmetic(batch_size=2))
        assert len(capture.gradients) == 1  # the hook runs under manual optimization
        gradients.append(capture.gradients[0])
    whole = gradients[-1]
    assert sum(g.abs().sum() for g in whole.values()) > 0
    for other in gradients[:-1]:
        for name in whole:
            assert_close(other[name], whole[name], rtol=1e-5, atol=1e-7, msg=lambda m: f"{name}: {m}")
