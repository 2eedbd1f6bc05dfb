"""StaticCacheGenerator: token parity with ``model.generate``, sampling distributions, EOS handling."""

from __future__ import annotations

import contextlib
import copy
import functools

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

import grpo_lightning.rollout.engine.generator as engine_module
import grpo_lightning.rollout.engine.model_forward as model_forward
from grpo_lightning.rollout.engine import (
    StaticCacheGenerator,
    cumulative_count_sample,
    exponential_race_sample,
    fast_generate_group,
    inverse_cdf_sample,
    keyed_uniforms,
    new_static_cache,
    sample_tokens,
    slot_limits,
)
from grpo_lightning.rollout.engine.kernels.availability import TRITON_INTERPRETED
from grpo_lightning.models.logprobs import completion_logprobs
from grpo_lightning.rollout.generation.hf import generate_group
from grpo_lightning.rollout.types import SamplingParams, completion_mask_from_ids
from grpo_lightning.quickstart.tiny import build_char_tokenizer, save_tiny_model, tiny_config

PROMPTS = ["1+2=", "37+45=", "(1)", "9", "<think>3*4=12", "0.5"]
MAX_NEW = 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request, tokenizer, tmp_path_factory):
    # A large initializer range gives peaked, context-dependent predictions: greedy completions
    # vary along the sequence instead of repeating one token.
    config = tiny_config(
        tokenizer,
        model_type=request.param,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=1.0,
    )
    path = save_tiny_model(tmp_path_factory.mktemp(f"tiny_{request.param}"), tokenizer, config, seed=0)
    return AutoModelForCausalLM.from_pretrained(path).eval()


@pytest.fixture(scope="module")
def qwen2(tokenizer, tmp_path_factory):
    config = tiny_config(
        tokenizer, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, initializer_range=0.3
    )
    path = save_tiny_model(tmp_path_factory.mktemp("tiny_qwen2_sampling"), tokenizer, config, seed=1)
    return AutoModelForCausalLM.from_pretrained(path).eval()


def encode(tokenizer, prompts):
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    return encoded["input_ids"], encoded["attention_mask"]


def hf_greedy(model, tokenizer, prompts, eos, min_new_tokens=0, max_new_tokens=MAX_NEW):
    ids, mask = (t.to(model.device) for t in encode(tokenizer, prompts))
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, ids.size(1) :]


def static_greedy(generator, tokenizer, prompts, eos, min_new_tokens=0, max_new_tokens=MAX_NEW):
    ids, mask = encode(tokenizer, prompts)
    sampling = SamplingParams(max_new_tokens, temperature=0.0, min_new_tokens=min_new_tokens)
    return generator.generate(ids, mask, sampling, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)


def unused_token(completions: torch.Tensor, tokenizer) -> int:
    """A non-pad id that greedy decoding never produces: an EOS that never fires."""
    used = set(completions.flatten().tolist()) | {tokenizer.pad_token_id}
    return next(i for i in range(len(tokenizer)) if i not in used)


def test_greedy_matches_generate_without_eos(model, tokenizer):
    reference = hf_greedy(model, tokenizer, PROMPTS, eos=tokenizer.eos_token_id)
    eos = unused_token(reference, tokenizer)
    reference = hf_greedy(model, tokenizer, PROMPTS, eos=eos)
    assert reference.shape == (len(PROMPTS), MAX_NEW)
    assert all(len(set(row)) >= 4 for row in reference.tolist()), "degenerate model: completions repeat a token"
    out = static_greedy(StaticCacheGenerator(model, len(PROMPTS), 32), tokenizer, PROMPTS, eos)
    assert torch.equal(out, reference)


@pytest.mark.parametrize("decode_attention", ["efficient", "math", "triton"])
def test_decode_attention_gives_the_default_greedy_tokens(model, tokenizer, decode_attention):
    eos = unused_token(hf_greedy(model, tokenizer, PROMPTS, eos=tokenizer.eos_token_id), tokenizer)
    default = static_greedy(StaticCacheGenerator(model, len(PROMPTS), 32), tokenizer, PROMPTS, eos)
    generator = StaticCacheGenerator(model, len(PROMPTS), 32, decode_attention=decode_attention)
    assert torch.equal(static_greedy(generator, tokenizer, PROMPTS, eos), default)


def test_slot_limits_are_few_multiples_of_a_block_up_to_the_cache():
    assert slot_limits(65, 319, 320) == [128, 192, 256, 320]  # W1: 64-token prompts, 256 new tokens
    assert slot_limits(1, 10, 40) == [40]  # the first multiple of 64 is past the cache
    assert slot_limits(64, 64, 64) == [64]
    # 1000 slots in 8 bounds at most: the width grows from 64 to 192 (128 would give 9 bounds)
    assert slot_limits(100, 1100, 1152) == [192, 384, 576, 768, 960, 1152]
    assert slot_limits(100, 1100, 1100) == [192, 384, 576, 768, 960, 1100]
    assert slot_limits(14, 28, 40, block=8) == [16, 24, 32]
    with pytest.raises(ValueError, match="first <= last <= cache_len"):
        slot_limits(10, 50, 40)


@pytest.mark.skipif(
    not (torch.cuda.is_available() or TRITON_INTERPRETED), reason="runs on CUDA or under TRITON_INTERPRET=1"
)
def test_triton_attention_reads_only_the_slots_in_use_and_gives_the_same_tokens(model, tokenizer, monkeypatch):
    """On CUDA through the CUDA graphs (one per bound), under the interpreter through eager steps."""
    decode_kernel = pytest.importorskip("grpo_lightning.rollout.engine.kernels.decode_attention")
    monkeypatch.setattr(engine_module, "SLOT_LIMIT_BLOCK", 8)  # bounds every 8 slots: W1's 64, scaled down
    limits = []
    launch = decode_kernel.launch_decode_attention

    def spy(query, key, *args, **kwargs):
        limits.append(decode_kernel._slot_limit)
        return launch(query, key, *args, **kwargs)

    monkeypatch.setattr(decode_kernel, "launch_decode_attention", spy)
    model = copy.deepcopy(model).to("cuda" if torch.cuda.is_available() else "cpu")
    eos = unused_token(hf_greedy(model, tokenizer, PROMPTS, eos=tokenizer.eos_token_id), tokenizer)
    whole = StaticCacheGenerator(model, len(PROMPTS), 40, decode_attention="triton", attend_slots_in_use=False)
    reference = static_greedy(whole, tokenizer, PROMPTS, eos)
    assert set(limits) == {None}
    generator = StaticCacheGenerator(model, len(PROMPTS), 40, decode_attention="triton")
    assert torch.equal(static_greedy(generator, tokenizer, PROMPTS, eos), reference)
    prompt_len = encode(tokenizer, PROMPTS)[0].size(1)  # the decode steps use the next MAX_NEW - 1 slots
    bounds = set(slot_limits(prompt_len + 1, prompt_len + MAX_NEW - 1, 40, block=8))
    assert len(bounds) >= 3 and max(bounds) < 40
    assert bounds <= set(limits) <= bounds | {None}  # None: a warm-up step reading the whole cache
    if torch.cuda.is_available():
        assert set(next(iter(generator._graphs.values()))) == bounds  # one graph per bound


def test_greedy_matches_generate_with_early_eos(model, tokenizer):
    free_run = hf_greedy(model, tokenizer, PROMPTS, eos=unused_token(hf_greedy(model, tokenizer, PROMPTS, 1), tokenizer))
    eos = int(free_run[0, 2])  # row 0 stops after 3 tokens; other rows stop wherever it shows up
    reference = hf_greedy(model, tokenizer, PROMPTS, eos=eos)
    out = static_greedy(StaticCacheGenerator(model, len(PROMPTS), 32), tokenizer, PROMPTS, eos)
    assert torch.equal(out, reference)
    assert (out[0, :3] == free_run[0, :3]).all() and (out[0, 3:] == tokenizer.pad_token_id).all()
    reference_mask, reference_truncated = completion_mask_from_ids(reference, eos)
    mask, truncated = completion_mask_from_ids(out, eos)
    assert torch.equal(mask, reference_mask) and torch.equal(truncated, reference_truncated)


def test_min_new_tokens_blocks_eos(model, tokenizer):
    free_run = hf_greedy(model, tokenizer, PROMPTS, eos=unused_token(hf_greedy(model, tokenizer, PROMPTS, 1), tokenizer))
    eos = int(free_run[0, 0])  # the very first greedy token of row 0
    reference = hf_greedy(model, tokenizer, PROMPTS, eos=eos, min_new_tokens=5)
    out = static_greedy(StaticCacheGenerator(model, len(PROMPTS), 32), tokenizer, PROMPTS, eos, min_new_tokens=5)
    assert torch.equal(out, reference)
    assert not (out[:, :5] == eos).any()


def test_batch_padding_chunking_reuse_and_growth(model, tokenizer):
    eos = tokenizer.eos_token_id
    reference = hf_greedy(model, tokenizer, PROMPTS, eos=eos)
    # Fewer rows than the cache (padded), more rows than the cache (chunks), a cache too short (grows).
    for generator in (
        StaticCacheGenerator(model, 16, 32),
        StaticCacheGenerator(model, 4, 32),
        StaticCacheGenerator(model, len(PROMPTS), 8),
    ):
        assert torch.equal(static_greedy(generator, tokenizer, PROMPTS, eos), reference)
        # The cache is reused: a different batch (other prompt length) and then the first again.
        subset = PROMPTS[2:4]
        assert torch.equal(static_greedy(generator, tokenizer, subset, eos), hf_greedy(model, tokenizer, subset, eos))
        assert torch.equal(static_greedy(generator, tokenizer, PROMPTS, eos), reference)
    assert generator.max_cache_len == 64


def test_runs_outside_autocast(model, tokenizer):
    """Rollouts run in the parameters' dtype even when the caller is under autocast."""
    eos = tokenizer.eos_token_id
    generator = StaticCacheGenerator(model, len(PROMPTS), 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = static_greedy(generator, tokenizer, PROMPTS, eos)
    assert torch.equal(out, hf_greedy(model, tokenizer, PROMPTS, eos))


def test_fast_generate_group_matches_generate_group(model, tokenizer):
    sampling = SamplingParams(MAX_NEW, temperature=0.0)
    expected = generate_group(model, tokenizer, PROMPTS[:3], 2, sampling)
    got = fast_generate_group(StaticCacheGenerator(model, 6, 32), tokenizer, PROMPTS[:3], 2, sampling)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


def total_variation(samples: torch.Tensor, probs: torch.Tensor) -> float:
    empirical = torch.bincount(samples, minlength=probs.numel()).double() / samples.numel()
    return 0.5 * (empirical - probs.double()).abs().sum().item()


def first_token_probs(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits[0, -1].float().softmax(-1)


@pytest.mark.parametrize(
    "temperature, top_k, top_p, keyed",
    [(1.0, 0, 1.0, False), (0.7, 0, 1.0, False), (1.0, 3, 1.0, False), (1.0, 0, 0.6, False), (1.0, 5, 0.8, False),
     (1.0, 0, 1.0, True), (0.7, 5, 0.8, True)],
)  # fmt: skip
def test_first_token_distribution(qwen2, tokenizer, temperature, top_k, top_p, keyed):
    rows = 4000
    ids, mask = encode(tokenizer, ["37+45="])
    probs = first_token_probs(qwen2, ids) ** (1.0 / temperature)
    probs /= probs.sum()
    keep = torch.ones_like(probs, dtype=torch.bool)
    if top_k:
        keep &= probs >= probs.topk(top_k).values[-1]
    if top_p < 1.0:  # the nucleus of the distribution left by top-k, renormalised
        restricted = probs.masked_fill(~keep, 0)
        restricted /= restricted.sum()
        order = restricted.argsort(descending=True)
        ranked = restricted[order]
        keep_ranked = (ranked.cumsum(0) - ranked) < top_p
        nucleus = torch.zeros_like(keep)
        nucleus[order[keep_ranked]] = True
        keep &= nucleus
    target = probs.masked_fill(~keep, 0)
    target /= target.sum()
    if top_k or top_p < 1.0:
        assert 2 <= int(keep.sum()) < probs.numel()

    torch.manual_seed(0)
    generator = StaticCacheGenerator(qwen2, rows, 16)
    sampling = SamplingParams(1, temperature=temperature, top_k=top_k, top_p=top_p)
    keys = torch.arange(rows) * 7919 + 11 if keyed else None
    out = generator.generate(ids.expand(rows, -1), mask.expand(rows, -1), sampling, None, tokenizer.pad_token_id, keys)
    first = out[:, 0]
    assert keep[first].all(), "a token outside the top-k / nucleus was sampled"
    assert total_variation(first, target) < 0.05


def test_sampled_continuations_use_the_decode_step(qwen2, tokenizer):
    """Second-token distribution after a fixed first token, sampled through a decode step."""
    rows = 4000
    ids, mask = encode(tokenizer, ["1+2="])
    # Keep the rows whose first token is the most likely one; their second token is drawn in a
    # decode step and must follow the model's prediction after that token.
    first = int(first_token_probs(qwen2, ids).argmax())
    extended = torch.cat([ids, torch.tensor([[first]])], dim=1)
    target = first_token_probs(qwen2, extended)
    torch.manual_seed(0)
    generator = StaticCacheGenerator(qwen2, rows, 16)
    out = generator.generate(ids.expand(rows, -1), mask.expand(rows, -1), SamplingParams(2), None, 0)
    second = out[out[:, 0] == first, 1]
    assert second.numel() > 500
    tolerance = 0.05 * (4000 / second.numel()) ** 0.5
    assert total_variation(second, target) < tolerance


def test_sample_tokens_support():
    torch.manual_seed(0)
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.5, 0.0, -1.0]]).expand(2000, -1)
    assert (sample_tokens(logits, 0.0) == 0).all()
    assert set(sample_tokens(logits, 1.0, top_k=2).tolist()) == {0, 1}
    probs = logits[0].softmax(-1)
    nucleus = int(((probs.cumsum(0) - probs) < 0.8).sum())  # 0.63 + 0.23 >= 0.8: two tokens
    assert set(sample_tokens(logits, 1.0, top_p=0.8).tolist()) == set(range(nucleus))
    assert set(sample_tokens(logits, 1.0, top_p=0.01).tolist()) == {0}
    assert set(sample_tokens(logits, 1.0).tolist()) == set(range(6))


def test_exponential_races_draw_from_the_softmax():
    """The CUDA path of ``sample_tokens``, run on the CPU: argmax(logits - log E) draws from softmax."""
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, float("-inf")]).expand(40_000, -1)
    counts = torch.bincount(exponential_race_sample(logits), minlength=5).double()
    assert counts[4] == 0
    total_variation = 0.5 * float((counts / counts.sum() - logits[0].softmax(-1)).abs().sum())
    assert total_variation < 0.01  # about 0.004 expected from 40,000 draws


def test_cumulative_count_sample_is_the_inverse_cdf_and_skips_zero_probabilities():
    """The CPU path of ``sample_tokens``: the token where the uniform falls in the cumulative
    distribution, from the unnormalised logits, never one of probability zero."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2000, 37, generator=generator, dtype=torch.float64) * 3
    logits[:, 5] = float("-inf")
    logits[:, 32:] = float("-inf")
    uniforms = torch.rand(2000, generator=generator, dtype=torch.float64)
    tokens = cumulative_count_sample(logits, uniforms)
    assert torch.equal(tokens, one_level_inverse_cdf(logits.softmax(-1), uniforms))
    ends = torch.tensor([[float("-inf"), 0.0, float("-inf"), 0.0, float("-inf")]]).expand(3, -1)
    tokens = cumulative_count_sample(ends, torch.tensor([0.0, 1 - 2**-24, 1.0]))
    assert tokens.tolist() == [1, 3, 3]


def one_level_inverse_cdf(probs, uniforms):
    cdf = probs.cumsum(-1)
    return torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)


@pytest.mark.parametrize("block", [1, 4, 16, 64])
def test_two_level_inverse_cdf_draws_what_one_cumulative_sum_draws(block):
    generator = torch.Generator().manual_seed(0)
    probs = torch.rand(2000, 37, generator=generator, dtype=torch.float64) ** 3
    probs[:, 5] = 0  # zeros inside blocks ...
    probs[:, 32:] = 0  # ... and whole blocks of zeros at the end
    probs /= probs.sum(-1, keepdim=True)
    uniforms = torch.rand(2000, generator=generator, dtype=torch.float64)
    tokens = inverse_cdf_sample(probs, uniforms, block)
    assert torch.equal(tokens, one_level_inverse_cdf(probs, uniforms))
    assert (probs.gather(1, tokens.unsqueeze(1)) > 0).all()


def test_inverse_cdf_never_draws_a_token_of_probability_zero_at_the_ends():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0, 0.0], [0.3, 0.0, 0.7, 0.0, 0.0, 0.0]])
    for u in (0.0, 1 - 2**-24, 1.0):  # 1.0: a target at the total mass, as rounding can give
        tokens = inverse_cdf_sample(probs, torch.full((2,), u), block=2)
        assert (probs.gather(1, tokens.unsqueeze(1)) > 0).all(), u


def test_the_compiled_two_level_inverse_cdf_gives_the_eager_tokens():
    generator = torch.Generator().manual_seed(1)
    probs = torch.rand(8, 1000, generator=generator).softmax(-1)
    uniforms = torch.rand(8, generator=generator)
    compiled = torch.compile(inverse_cdf_sample, dynamic=False)
    assert torch.equal(compiled(probs, uniforms, 64), inverse_cdf_sample(probs, uniforms, 64))


def test_keyed_uniforms_are_uniform_and_independent_across_keys_and_counters():
    keys = torch.arange(100_000, dtype=torch.int64) + 2**40  # the high word enters too
    u = keyed_uniforms(keys, torch.tensor([0]))
    assert torch.equal(u, keyed_uniforms(keys.clone(), torch.tensor([0])))  # a function of key and counter
    assert 0 < u.min() and u.max() < 1
    counts = torch.histc(u, bins=20, min=0, max=1)
    chi2 = float(((counts - 5000) ** 2 / 5000).sum())
    assert chi2 < 50  # 19 degrees of freedom: p < 1e-4 above 45
    following = keyed_uniforms(keys, torch.tensor([1]))
    assert abs(float(torch.corrcoef(torch.stack([u, following]))[0, 1])) < 0.02
    assert abs(float(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1])) < 0.02  # consecutive keys


def test_keyed_sampling_of_a_row_does_not_depend_on_the_rest_of_the_batch(qwen2, tokenizer):
    ids, mask = encode(tokenizer, PROMPTS)
    keys = torch.arange(len(PROMPTS)) * 1_000_003 + 5
    sampling = SamplingParams(MAX_NEW, temperature=1.0, top_k=8)
    torch.manual_seed(0)
    whole = StaticCacheGenerator(qwen2, len(PROMPTS), 32).generate(ids, mask, sampling, None, 0, keys)
    # Other rows, another order, another left padding, chunks of two rows, another global seed.
    rows = torch.tensor([4, 1, 2])
    part_ids, part_mask = encode(tokenizer, [PROMPTS[i] for i in rows])
    torch.manual_seed(1)
    part = StaticCacheGenerator(qwen2, 2, 32).generate(part_ids, part_mask, sampling, None, 0, keys[rows])
    assert torch.equal(part, whole[rows, : part.size(1)])
    assert (whole[:, 1:] != whole[:, :1]).any(), "completions should vary"
    torch.manual_seed(0)
    other_keys = StaticCacheGenerator(qwen2, len(PROMPTS), 32).generate(ids, mask, sampling, None, 0, keys + 1)
    assert not torch.equal(other_keys, whole)


def test_repeated_prompts_are_prefilled_once(qwen2, tokenizer):
    """A GRPO batch holds each prompt ``group_size`` times: the prefill runs its distinct prompts
    through the model, and every row gets the cache its prompt alone gives (keyed samples, which
    depend on a row alone, equal those of the row generated by itself)."""
    prompts = [PROMPTS[i] for i in (0, 1, 2) for _ in range(4)]
    ids, mask = encode(tokenizer, prompts)
    keys = torch.arange(len(prompts)) * 7919 + 3
    sampling = SamplingParams(MAX_NEW, temperature=1.0)
    batch_sizes = []
    hook = qwen2.register_forward_pre_hook(
        lambda module, args, kwargs: batch_sizes.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    try:
        out = StaticCacheGenerator(qwen2, len(prompts), 32).generate(ids, mask, sampling, None, 0, keys)
    finally:
        hook.remove()
    assert batch_sizes[0] == (3, ids.size(1))  # the prefill: three distinct prompts
    assert all(size == (len(prompts), 1) for size in batch_sizes[1:])  # the decode steps
    assert all(len(set(map(tuple, out[g : g + 4].tolist()))) > 1 for g in (0, 4, 8)), "a group's rows should differ"
    for row in range(len(prompts)):
        one = slice(row, row + 1)
        alone = StaticCacheGenerator(qwen2, 1, 32).generate(ids[one], mask[one], sampling, None, 0, keys[one])
        assert torch.equal(alone, out[row : row + 1, : alone.size(1)]), row


def test_repeated_prompts_greedy_match_generate_also_when_the_model_bypasses_update(model, tokenizer, monkeypatch):
    """Greedy completions of repeated prompts equal ``model.generate``'s, with the shared prefill and
    with a model whose prefill does not write every layer through ``cache.update`` (simulated: its
    writes go to a cache of its own), for which the engine prefills every row instead."""
    prompts = [PROMPTS[i] for i in (0, 0, 1, 4, 1, 0)]
    eos = unused_token(hf_greedy(model, tokenizer, prompts, eos=tokenizer.eos_token_id), tokenizer)
    reference = hf_greedy(model, tokenizer, prompts, eos=eos)
    assert torch.equal(static_greedy(StaticCacheGenerator(model, len(prompts), 32), tokenizer, prompts, eos), reference)

    def writes_elsewhere(cache, distinct, inverse, written):
        return new_static_cache(model.config, len(distinct), 32, torch.device("cpu"), torch.float32)  # the engine's length

    monkeypatch.setattr(model_forward, "shared_prefill_cache", writes_elsewhere)
    out = static_greedy(StaticCacheGenerator(model, len(prompts), 32), tokenizer, prompts, eos)
    assert torch.equal(out, reference)


def sampled_against_teacher_forced(model, tokenizer, sampling: SamplingParams, eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs the engine reports for its samples, and a teacher-forced pass's, on the real tokens."""
    ids, mask = encode(tokenizer, PROMPTS * 4)
    ids, mask = ids.to(model.device), mask.to(model.device)
    generator = StaticCacheGenerator(model, ids.size(0), 48)
    out, sampled = generator.generate(ids, mask, sampling, eos, tokenizer.pad_token_id, return_logprobs=True)
    completion_mask, _ = completion_mask_from_ids(out, eos)
    with torch.no_grad():
        forced, _ = completion_logprobs(model, ids, mask, out, completion_mask, temperature=sampling.temperature)
    real = completion_mask.bool()
    assert (sampled[~real] == 0).all()
    return sampled[real].float(), forced[real].float()


def test_sampled_logprobs_are_the_teacher_forced_logprobs(qwen2, tokenizer):
    torch.manual_seed(0)
    eos = int(first_token_probs(qwen2, encode(tokenizer, ["1+2="])[0]).argsort()[-3])
    sampled, forced = sampled_against_teacher_forced(qwen2, tokenizer, SamplingParams(MAX_NEW, 0.7, top_k=6), eos)
    assert sampled.numel() > 100
    torch.testing.assert_close(sampled, forced, rtol=0, atol=1e-4)


def test_pad_after_eos_in_sampled_completions(qwen2, tokenizer):
    rows = 64
    ids, mask = encode(tokenizer, ["1+2=", "(1)"])
    ids, mask = ids.repeat(rows // 2, 1), mask.repeat(rows // 2, 1)
    eos = int(first_token_probs(qwen2, ids[:1]).argsort()[-2])  # a likely token: many rows stop early
    assert eos != tokenizer.pad_token_id
    torch.manual_seed(0)
    generator = StaticCacheGenerator(qwen2, rows, 32)
    out = generator.generate(ids, mask, SamplingParams(MAX_NEW, min_new_tokens=2), eos, tokenizer.pad_token_id)
    completion_mask, truncated = completion_mask_from_ids(out, eos)
    assert (~truncated).any() and (out[:, :2] != eos).all()
    assert torch.equal(out.masked_fill(completion_mask == 0, tokenizer.pad_token_id), out)
    assert completion_mask.sum(1).max() == out.size(1)  # cut after the longest completion


def test_rejects_unsupported_attention(qwen2):
    original = qwen2.config._attn_implementation
    qwen2.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(ValueError, match="attn_implementation"):
            StaticCacheGenerator(qwen2, 2, 16)
    finally:
        qwen2.config._attn_implementation = original


def test_rejects_unknown_decode_attention(qwen2):
    with pytest.raises(ValueError, match=r"decode_attention must be one of 'auto', 'sdpa', 'efficient', 'math', 'triton', got 'cudnn'"):
        StaticCacheGenerator(qwen2, 2, 16, decode_attention="cudnn")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_matches_eager_and_follows_weights(tokenizer, tmp_path):
    config = tiny_config(tokenizer, hidden_size=64, num_layers=2, initializer_range=1.0)
    model = AutoModelForCausalLM.from_pretrained(save_tiny_model(tmp_path, tokenizer, config)).cuda().eval()
    eos = tokenizer.eos_token_id
    graphed = StaticCacheGenerator(model, len(PROMPTS), 40, check_every=4)
    eager = StaticCacheGenerator(model, len(PROMPTS), 40, use_cuda_graph=False)
    assert torch.equal(static_greedy(graphed, tokenizer, PROMPTS, eos), static_greedy(eager, tokenizer, PROMPTS, eos))
    assert torch.equal(static_greedy(graphed, tokenizer, PROMPTS, eos), hf_greedy(model, tokenizer, PROMPTS, eos))
    ids, mask = encode(tokenizer, PROMPTS)
    keys, sampling = torch.arange(len(PROMPTS)) + 3, SamplingParams(24, temperature=1.0)
    keyed = [g.generate(ids, mask, sampling, eos, tokenizer.pad_token_id, keys) for g in (graphed, eager)]
    assert torch.equal(*keyed)
    # In-place weight updates are seen by the captured graph.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    assert torch.equal(static_greedy(graphed, tokenizer, PROMPTS, eos), static_greedy(eager, tokenizer, PROMPTS, eos))
    # New parameter tensors: captured again.
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data * 0.5
    assert torch.equal(static_greedy(graphed, tokenizer, PROMPTS, eos), hf_greedy(model, tokenizer, PROMPTS, eos))
    # Sampling in the graph draws fresh noise on each replay.
    ids, mask = encode(tokenizer, ["37+45="])
    rows = 4000
    sampler = StaticCacheGenerator(model, rows, 16)
    out = sampler.generate(ids.expand(rows, -1), mask.expand(rows, -1), SamplingParams(3), None, 0)
    probs = first_token_probs(model, ids.cuda()).cpu()
    assert total_variation(out[:, 0].cpu(), probs) < 0.05
    assert out[:, 1].unique().numel() > 3 and out[:, 2].unique().numel() > 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bf16_sampled_logprobs_match_a_teacher_forced_pass_within_bf16_tolerance(tokenizer, tmp_path):
    config = tiny_config(tokenizer, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, initializer_range=0.1)
    path = save_tiny_model(tmp_path, tokenizer, config)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    torch.manual_seed(0)
    sampled, forced = sampled_against_teacher_forced(model, tokenizer, SamplingParams(40, 1.0), tokenizer.eos_token_id)
    difference = (sampled - forced).abs()
    print(f"bf16 sampled vs teacher-forced log-probs over {difference.numel()} tokens: "
          f"max |diff| {difference.max():.4f}, mean |diff| {difference.mean():.5f}")  # fmt: skip
    assert difference.mean() < 0.02 and difference.max() < 0.25


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("decode_attention", ["sdpa", "efficient", "math", "triton"])
def test_compiled_decode_step_matches_the_eager_one(tokenizer, tmp_path, decode_attention):
    config = tiny_config(tokenizer, hidden_size=64, num_layers=2, initializer_range=1.0)
    model = AutoModelForCausalLM.from_pretrained(save_tiny_model(tmp_path, tokenizer, config)).cuda().eval()
    eos = tokenizer.eos_token_id
    compiled = StaticCacheGenerator(model, len(PROMPTS), 40, compile=True, decode_attention=decode_attention)
    eager = StaticCacheGenerator(model, len(PROMPTS), 40, use_cuda_graph=False)
    assert torch.equal(static_greedy(compiled, tokenizer, PROMPTS, eos), static_greedy(eager, tokenizer, PROMPTS, eos))
    ids, mask = encode(tokenizer, PROMPTS)
    keys, sampling = torch.arange(len(PROMPTS)) + 3, SamplingParams(24, temperature=1.0)
    keyed = [g.generate(ids, mask, sampling, eos, tokenizer.pad_token_id, keys) for g in (compiled, eager)]
    assert torch.equal(*keyed)


def test_a_failing_compiler_falls_back_to_the_compiled_forward_then_to_eager(qwen2, tokenizer, monkeypatch):
    """Inductor fails on some graphs (it did on a 1.5B model's whole decode step, on an H200): a
    stand-in for ``torch.compile`` that fails on chosen functions checks the fallback order."""
    compiled = []

    def stand_in_compile(function, **kwargs):
        name = function.__name__
        compiled.append(name)

        def run(*args, **kw):
            if name in failing:
                raise RuntimeError(f"cannot compile {name}")
            return function(*args, **kw)

        return run

    monkeypatch.setattr(torch, "compile", stand_in_compile)
    ids, mask = encode(tokenizer, PROMPTS)
    sampling = SamplingParams(4)
    for failing, expected in [({"_decode_step"}, "forward"), ({"_decode_step", "_decode_forward"}, "eager"), (set(), "step")]:
        generator = StaticCacheGenerator(qwen2, len(PROMPTS), 32, use_cuda_graph=False, compile=True)
        generator._prepare(qwen2.device, ids.size(1) + 4)
        generator._buffers.set_stop_tokens([], 0, 0)
        generator._prefill(ids, mask)
        with pytest.warns(UserWarning) if failing else contextlib.nullcontext() as caught:
            step = generator._first_working_step(sampling)
        if failing:
            assert all("torch.compile" in str(w.message) for w in caught)
        if step == generator._decode_step:
            kind = "eager"
        else:
            kind = "forward" if isinstance(step, functools.partial) else "step"
        assert kind == expected
        assert int(generator._buffers.step) == 1  # the step ran once, whichever candidate ran it
