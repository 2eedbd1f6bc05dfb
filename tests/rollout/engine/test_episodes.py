"""Multi-turn episodes on the static engine: a turn continued on the cache samples what feeding the
whole history to ``model.generate`` samples, whichever way the cache was filled."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_lightning.rollout.engine import StaticCacheGenerator
from grpo_lightning.rollout.generation.hf import generate_from_ids
from grpo_lightning.quickstart.tiny import build_char_tokenizer, save_tiny_model, tiny_config
from grpo_lightning.rollout.types import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = ["1+2=", "37+45=", "(1)", "9*9="]
GREEDY = SamplingParams(6, temperature=0.0)


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request, tokenizer, tmp_path_factory):
    # Peaked, context-dependent predictions: a token fed at a wrong position or with a wrong
    # neighbour changes the greedy continuation.
    config = tiny_config(tokenizer, model_type=request.param, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                         intermediate_size=64, max_position_embeddings=64, initializer_range=1.0)  # fmt: skip
    path = save_tiny_model(tmp_path_factory.mktemp(f"episodes_{request.param}"), tokenizer, config, seed=0)
    return AutoModelForCausalLM.from_pretrained(path).eval()


def turn_tokens(ids: list[int], eos: int) -> list[int]:
    """A turn up to and including its first EOS."""
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def fed_again(model, tokenizer, histories: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
    """Each history's greedy turn and its log-probs from ``model.generate`` on the whole history."""
    width = max(len(h) for h in histories)
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(h)) + h for h in histories], device=model.device)
    mask = torch.tensor([[0] * (width - len(h)) + [1] * len(h) for h in histories], device=model.device)
    new_ids, logprobs = generate_from_ids(model, tokenizer, ids, mask, GREEDY, 1, True)
    turns = [turn_tokens(row, tokenizer.eos_token_id) for row in new_ids.tolist()]
    return turns, [lp[: len(t)] for t, lp in zip(turns, logprobs.tolist())]


@pytest.fixture
def counted(monkeypatch):
    """How often the engine prefilled whole histories, and appended to its cache (a spy on its methods)."""
    counts = {"_prefill": 0, "_append": 0}
    for name in counts:
        method = getattr(StaticCacheGenerator, name)

        def counting(self, *args, _name=name, _method=method, **kwargs):
            counts[_name] += 1
            return _method(self, *args, **kwargs)

        monkeypatch.setattr(StaticCacheGenerator, name, counting)
    return counts


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
def test_turns_continued_on_the_cache_sample_what_the_whole_history_samples(device, model, tokenizer, counted):
    """Rows keep turns of different lengths and get replies of different lengths (or none); one
    episode ends; one history is rewritten (the cache no longer holds a prefix of it); the cache runs
    out of room. Every turn samples what ``model.generate`` samples from the whole history. On CUDA
    the decode steps replay CUDA graphs, captured once, on the first turn."""
    model = copy.deepcopy(model).to(device) if device != "cpu" else model
    eos = tokenizer.eos_token_id
    histories = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    engine = StaticCacheGenerator(model, len(PROMPTS), 8)
    engine.start_episodes(len(PROMPTS), eos, tokenizer.pad_token_id, max_history=52, return_logprobs=True)
    running, paths = [True] * len(PROMPTS), []
    for turn in range(9):
        before = dict(counted)
        ids, logprobs = engine.sample_turn([h if r else None for h, r in zip(histories, running)], GREEDY)
        paths += [name for name in counted if counted[name] > before[name]]
        rows = [row for row, r in enumerate(running) if r]
        expected, expected_logprobs = fed_again(model, tokenizer, [histories[row] for row in rows])
        for row, want, want_logprobs in zip(rows, expected, expected_logprobs):
            got = turn_tokens(ids[row].tolist(), eos)
            assert got == want, (turn, row)
            torch.testing.assert_close(logprobs[row, : len(got)].tolist(), want_logprobs, atol=1e-4, rtol=0)
        for row in rows:  # keep 1 to 6 of the turn's tokens, then a reply of 0 to 3 tokens
            kept = 1 + (row + turn) % GREEDY.max_new_tokens
            histories[row] = histories[row] + ids[row, :kept].tolist() + histories[row][1 : 1 + (row + 2 * turn) % 4]
        if turn == 1:
            running[1] = False  # rides along, finished, from now on
        if turn == 2:
            histories[2][1] = histories[2][0]  # not what the cache holds: the histories are prefilled again
    assert engine.max_cache_len == 64
    if device == "cuda":
        assert len(next(iter(engine._graphs.values()))) >= 1
    # Turn 3: the rewritten history. Turn 8: 62 slots were written, and the next turn needs more than 2.
    assert paths == ["_prefill", "_append", "_append", "_prefill", "_append", "_append", "_append", "_append", "_prefill"]


def test_episodes_need_a_start_rows_that_fit_and_a_cache_no_single_turn_batch_overwrote(model, tokenizer):
    engine = StaticCacheGenerator(model, 2, 32)
    with pytest.raises(ValueError, match="call start_episodes first"):
        engine.sample_turn([[1, 2]], GREEDY)
    with pytest.raises(ValueError, match="rows must be from 1 to max_batch_size"):
        engine.start_episodes(3, tokenizer.eos_token_id, tokenizer.pad_token_id, 16)
    engine.start_episodes(2, tokenizer.eos_token_id, tokenizer.pad_token_id, 4)
    with pytest.raises(ValueError, match="over max_history"):
        engine.sample_turn([[1, 2, 3, 4, 5], None], GREEDY)
    engine.sample_turn([[1, 2], [3]], GREEDY)
    engine.generate(torch.tensor([[1, 2]]), torch.tensor([[1, 1]]), GREEDY, tokenizer.eos_token_id, tokenizer.pad_token_id)
    with pytest.raises(ValueError, match="call start_episodes first"):  # the cache no longer holds the episodes
        engine.sample_turn([[1, 2, 4], [3, 5]], GREEDY)
