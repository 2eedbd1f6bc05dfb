"""Process rewards (``grpo_lightning.rewards.process``, ``grpo_lightning.rewards.process_supervision``):
step ends, group-normalised step rewards and per-token advantages by hand, the rule-based step
scorer, and a process reward model saved and loaded (``prm_dir``, tests/conftest.py). The ProcessGRPO
preset's fits are tests/variants/test_process_grpo.py."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from grpo_lightning.rewards.process_supervision import (
    delimited_step_ends,
    step_advantages,
    step_rewards,
    token_at,
)
from grpo_lightning.rewards import ProcessRewardModel, answer_prefix_steps


def test_delimited_steps_end_after_their_delimiter():
    assert delimited_step_ends("a\n\nbb\n\nc", "\n\n") == [3, 7, 8]
    assert delimited_step_ends("a\n\n", "\n\n") == [3]
    assert delimited_step_ends("one step", "\n\n") == [8]
    assert delimited_step_ends("", "\n\n") == []


def test_token_at_finds_the_token_that_ends_a_character():
    ends = [2, 5, 6, 9]  # token texts end at these offsets
    assert [token_at(ends, c) for c in (1, 2, 3, 6, 9, 20)] == [0, 0, 1, 2, 3, 3]


def test_step_advantages_by_hand():
    # One group of 2: completion 0 has steps ending at tokens 1 and 3 (scores 1, 0), 5 tokens;
    # completion 1 one step at token 2 (score 1), 3 tokens. R = [1, 0, 1]: mean 2/3, unbiased std
    # sqrt(1/3), so r~ = [a, -2a, a] with a = (1/3) / (sqrt(1/3) + 1e-4).
    a = (1 / 3) / (math.sqrt(1 / 3) + 1e-4)
    pairs = [[(1, 1.0), (3, 0.0)], [(2, 1.0)]]
    got = step_advantages(pairs, group_size=2, lengths=torch.tensor([5, 3]), width=5)
    # the last step of completion 0 reaches its last token (4); a token's advantage sums the steps
    # ending at or after it
    expected = torch.tensor([[a - 2 * a, a - 2 * a, -2 * a, -2 * a, -2 * a], [a, a, a, 0.0, 0.0]])
    assert_close(got, expected.float())


def test_a_group_of_equal_step_rewards_has_no_advantage():
    got = step_advantages([[(0, 1.0)], [(1, 1.0)], [(0, 0.0)], [(0, 1.0)]], 2, torch.tensor([2, 2, 1, 1]), 2)
    assert (got[:2] == 0).all() and (got[2:] != 0).any()


def test_scores_per_delimited_step_map_to_tokens_and_are_checked():
    completions = ["ab\n\ncd", "xyz"]
    char_ends = [[1, 2, 3, 4, 5, 6], [1, 2, 3]]

    def two_then_one(prompts, completions, **columns):
        return [[0.5, 1.0], [0.0]]

    pairs = step_rewards(two_then_one, "f", ["p", "q"], completions, {}, char_ends, "\n\n")
    assert pairs == [[(3, 0.5), (5, 1.0)], [(2, 0.0)]]
    with pytest.raises(ValueError, match="gave 1 scores for completion 0, which has 2 steps"):
        step_rewards(lambda p, c: [[1.0], [0.0]], "f", ["p", "q"], completions, {}, char_ends, "\n\n")
    with pytest.raises(ValueError, match="returned 1 results for 2 completions"):
        step_rewards(lambda p, c: [[1.0]], "f", ["p", "q"], completions, {}, char_ends, "\n\n")
    with pytest.raises(ValueError, match="end_token_index 9 of completion 1 is outside its 3 tokens"):
        step_rewards(lambda p, c: [[(0, 1.0)], [(9, 1.0)]], "f", ["p", "q"], completions, {}, char_ends, "\n\n")
    with pytest.raises(ValueError, match="return finite numbers"):
        step_rewards(lambda p, c: [[(0, math.nan)], []], "f", ["p", "q"], completions, {}, char_ends, "\n\n")


def test_answer_prefix_steps_by_hand():
    # One character per token, so token t ends at character t + 1.
    completions = ["<answer>82</answer>", "<answer>85</answer>", "82"]
    token_ends = [list(range(1, len(c) + 1)) for c in completions]
    got = answer_prefix_steps(["37+45="] * 3, completions, answer=["82"] * 3, token_ends=token_ends)
    # "<answer>" is 8 characters: the digits end at characters 9 and 10 (tokens 8 and 9)
    assert got[0] == [(8, 1.0), (9, 1.0), (18, 1.0)]
    assert got[1] == [(8, 1.0), (9, 0.0), (18, 0.0)]
    assert got[2] == [(1, 0.0)]  # no answer tag: one step, 0
    # a second answer replaces the first, as for accuracy_reward: the steps are the last answer's
    revised = "<answer>5</answer><answer>82</answer>"
    got = answer_prefix_steps(["37+45="], [revised], answer=["82"], token_ends=[list(range(1, len(revised) + 1))])
    assert got[0] == [(26, 1.0), (27, 1.0), (len(revised) - 1, 1.0)]


def test_a_process_reward_model_scores_each_step(prm_dir):
    model = ProcessRewardModel(prm_dir, step_delimiter="\n\n")
    scores = model(["1+1=", "2+2="], ["a\n\nb\n\nc", "4"])
    assert [len(s) for s in scores] == [3, 1]
    assert all(0.0 < score < 1.0 for steps in scores for score in steps)
    assert model(["1+1="], ["a\n\nb\n\nc"]) == scores[:1]  # deterministic
    with pytest.raises(ValueError, match="positive_label=5"):
        ProcessRewardModel(prm_dir, positive_label=5)(["1"], ["2"])
