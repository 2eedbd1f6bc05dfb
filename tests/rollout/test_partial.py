"""Partial rollouts: a completion cut after its first chunk and continued with the weights of a
later version conditions on exactly its tokens so far, and records each token's version."""

from __future__ import annotations

import pytest
import torch

from grpo_lightning.rollout.partial import (
    completions_of,
    continue_rollouts,
    cut,
    unfinished,
    with_completions,
)
from grpo_lightning.rollout.types import Rollout
from grpo_lightning.variants import GRPO


@pytest.mark.parametrize("rollout_engine", ["hf", "static"])
def test_a_cut_completion_continues_on_its_exact_prefix_and_records_each_chunks_version(make_module, one_torch_thread,
                                                                                         rollout_engine):  # fmt: skip
    grpo = make_module(GRPO, policy={"dtype": "float32"}, sampling={"max_new_tokens": 6},
                       engine={"rollout": rollout_engine, "compile": False})  # fmt: skip
    torch.manual_seed(0)
    sampled = grpo.generate({"prompt": ["1+2=", "30+4="]}, grpo.settings.group_size, grpo.sampling, with_logprobs=True)
    rollout = cut(sampled, 2, grpo.tokenizer, grpo.sampling.end_ids(grpo.tokenizer))
    assert rollout.completion_mask.sum(1).max() == 2 and (rollout.sampling_version == 0).all()
    with grpo.rollout_model() as model:
        engine = grpo.sampler.turn_engine(model, len(rollout.completions), grpo.sampling)
        assert (engine is None) == (rollout_engine == "hf")
        (rollout,), added = continue_rollouts(model, grpo.tokenizer, [rollout], grpo.sampling, 2, 5, lambda rows: engine)
        (rollout,), added_too = continue_rollouts(model, grpo.tokenizer, [rollout], grpo.sampling, 2, 7, lambda rows: engine)
    lengths = rollout.completion_mask.sum(1).long()
    assert added + added_too == int(lengths.sum()) - int(cut(sampled, 2, grpo.tokenizer, grpo.sampling.end_ids(grpo.tokenizer)).completion_mask.sum())
    for row, (ids, _, versions) in enumerate(completions_of(rollout)):
        assert versions == ([0, 0] + [5, 5] + [7, 7])[: len(ids)], row  # the chunk each token came from
        ended = bool(ids) and ids[-1] == grpo.tokenizer.eos_token_id
        assert bool(rollout.truncated[row]) == (not ended) and (ended or len(ids) == 6)
        assert rollout.completions[row] == grpo.tokenizer.decode(ids, skip_special_tokens=True)
    # The same weights throughout: the recorded log-probs are the training pass's of the whole completion.
    mask = rollout.completion_mask.bool()
    torch.testing.assert_close(rollout.sampling_logp[mask], grpo.compute_logprobs(grpo.policy, rollout)[mask],
                               atol=1e-4, rtol=1e-4)  # fmt: skip


@pytest.mark.parametrize("rollout_engine", ["hf", "static"])
def test_rollouts_in_flight_continue_in_one_call_where_their_chunks_have_the_same_bounds(make_module, one_torch_thread,
                                                                                         rollout_engine):  # fmt: skip
    """Three queued rollouts cut at 1, 3 and 4 tokens of 5, continued by chunks of 2: the first two take 2
    more tokens each (one call for both), the third 1 (its last chunk: a call of its own). Each continues
    on its own prefix: with the same weights, the recorded log-probs are the training pass's."""
    grpo = make_module(GRPO, policy={"dtype": "float32"}, sampling={"max_new_tokens": 5},
                       engine={"rollout": rollout_engine, "compile": False})  # fmt: skip
    torch.manual_seed(0)
    sampled = [grpo.generate({"prompt": prompts}, grpo.settings.group_size, grpo.sampling, with_logprobs=True)
               for prompts in (["1+2=", "30+4="], ["7+7="], ["12+1=", "4+4="])]  # fmt: skip
    queued = [cut(rollout, done, grpo.tokenizer, grpo.sampling.end_ids(grpo.tokenizer)) for rollout, done in zip(sampled, (1, 3, 4))]
    calls = []
    with grpo.rollout_model() as model:

        def engine_for(rows):
            calls.append(rows)
            return grpo.sampler.turn_engine(model, rows, grpo.sampling)

        continued, added = continue_rollouts(model, grpo.tokenizer, queued, grpo.sampling, 2, version=3, engine_for=engine_for)
    eos = set(grpo.sampling.end_ids(grpo.tokenizer))
    active = [sum(unfinished(c, eos, 5) for c in completions_of(q)) for q in queued]
    assert active[0] and active[2]  # (so both calls are made)
    assert calls == [active[0] + active[1], active[2]]  # rows of the first two rollouts together, then the third's
    assert added == sum(int(c.completion_mask.sum()) - int(q.completion_mask.sum()) for c, q in zip(continued, queued))
    for before, after, done in zip(queued, continued, (1, 3, 4)):
        for (ids, _, versions), (old, _, _) in zip(completions_of(after), completions_of(before)):
            assert ids[: len(old)] == old and versions == [0] * len(old) + [3] * (len(ids) - len(old))
            assert len(ids) <= min(done + 2, 5) if unfinished((old, [], []), eos, 5) else ids == old  # an ended one stays
        mask = after.completion_mask.bool()
        torch.testing.assert_close(after.sampling_logp[mask], grpo.compute_logprobs(grpo.policy, after)[mask],
                                   atol=1e-4, rtol=1e-4)  # fmt: skip


def test_with_completions_pads_masks_and_marks_the_unfinished_by_hand(make_module):
    tokenizer = make_module(GRPO).tokenizer
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rollout = Rollout(group_size=2, prompt_ids=torch.zeros(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1),
                      completion_ids=torch.zeros(2, 1, dtype=torch.long), completion_mask=torch.ones(2, 1),
                      truncated=torch.zeros(2, dtype=torch.bool), prompts=["a", "a"], completions=["", ""])  # fmt: skip
    rows = [([5, eos], [-0.5, -1.0], [1, 2]), ([6, 7, 8], [-0.25, -0.5, -2.0], [3, 3, 4])]
    got = with_completions(rollout, rows, tokenizer, [eos])
    assert got.completion_ids.tolist() == [[5, eos, pad], [6, 7, 8]]
    assert got.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert got.truncated.tolist() == [False, True]  # the first ended with EOS, the second did not
    assert got.sampling_logp.tolist() == [[-0.5, -1.0, 0.0], [-0.25, -0.5, -2.0]]
    assert got.sampling_version.tolist() == [[1, 2, 0], [3, 3, 4]]
    assert completions_of(got) == rows
    assert completions_of(cut(got, 1, tokenizer, [eos])) == [([5], [-0.5], [1]), ([6], [-0.25], [3])]
    assert cut(got, 1, tokenizer, [eos]).truncated.tolist() == [True, True]  # neither ended within one token
    # another end id (a model's end of turn besides the tokenizer's EOS) ends the second completion too
    assert with_completions(rollout, rows, tokenizer, [eos, 8]).truncated.tolist() == [False, False]
