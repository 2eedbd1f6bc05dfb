"""The Triton sampling kernels (``grpo_lightning.rollout.engine.kernels.sampling``) against the PyTorch draw.

They run on CUDA, or on the CPU under Triton's interpreter: ``test_decode_kernel.py``'s
``test_the_kernel_under_triton_s_interpreter`` runs this file in a process with
``TRITON_INTERPRET=1``. On CUDA the engine's tests (``test_engine.py``) also draw through them, as
the kernels are the engine's default there.
"""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_lightning.rollout.engine import StaticCacheGenerator, inverse_cdf_sample
from grpo_lightning.rollout.types import SamplingParams
from grpo_lightning.quickstart.tiny import build_char_tokenizer, save_tiny_model, tiny_config

RUNS_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernels = pytest.mark.skipif(not RUNS_HERE, reason="runs on CUDA or under TRITON_INTERPRET=1 (see above)")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def kernels():
    pytest.importorskip("triton")
    from grpo_lightning.rollout.engine.kernels import sampling as sampling_kernel

    return sampling_kernel


def no_ban(vocab, blocked=False):
    return torch.zeros(vocab, dtype=torch.bool, device=DEVICE), torch.tensor(blocked, device=DEVICE)


# ------------------------------------------------------------------------------------------ the op


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_the_draw_is_the_inverse_cdf_draw_of_the_tempered_softmax(dtype, temperature):
    ops = kernels()
    gen = torch.Generator().manual_seed(0)
    rows, vocab = 12, 2 * ops.SAMPLING_BLOCK + 77  # a last block that is mostly padding
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(DEVICE, dtype)
    uniforms = torch.rand(rows, generator=gen).to(DEVICE)
    tokens, logprobs = ops.sample_by_blocks(logits, uniforms, temperature, *no_ban(vocab), True)
    tempered = logits.float() / temperature
    expected = inverse_cdf_sample(tempered.softmax(-1), uniforms, block=ops.SAMPLING_BLOCK)
    assert torch.equal(tokens, expected)
    log_softmax = tempered.log_softmax(-1).gather(1, tokens[:, None]).squeeze(1)
    torch.testing.assert_close(logprobs, log_softmax, rtol=0, atol=1e-5)


@needs_kernels
def test_stratified_uniforms_draw_each_token_in_proportion_to_its_probability():
    """With ``u = (i + 1/2) / N`` the draw of inverse-CDF sampling is exact: token ``t`` is drawn by
    the ``u`` in ``[cdf(t-1), cdf(t))``, ``N p_t`` of them give or take one."""
    ops = kernels()
    vocab, draws = 2 * ops.SAMPLING_BLOCK + 5, 200
    logits = torch.full((vocab,), float("-inf"))
    chosen = torch.tensor([3, ops.SAMPLING_BLOCK - 1, ops.SAMPLING_BLOCK, 2 * ops.SAMPLING_BLOCK + 1, vocab - 1])
    probs = torch.tensor([0.1, 0.25, 0.05, 0.4, 0.2])
    logits[chosen] = probs.log()
    uniforms = (torch.arange(draws) + 0.5) / draws
    tokens, _ = ops.sample_by_blocks(logits.expand(draws, -1).to(DEVICE), uniforms.to(DEVICE), 1.0, *no_ban(vocab), False)
    counts = torch.bincount(tokens.cpu(), minlength=vocab)
    assert counts.sum() == draws and counts[chosen].sum() == draws, "a token of probability zero was drawn"
    assert (counts[chosen] - probs * draws).abs().max() <= 1


@needs_kernels
def test_tokens_of_probability_zero_are_never_drawn_even_at_the_ends():
    ops = kernels()
    vocab = ops.SAMPLING_BLOCK + 300
    logits = torch.full((4, vocab), float("-inf"))
    logits[:, 5] = 0.0
    logits[:, 17] = -3.0  # the last token of positive probability of block 0; block 1 is all zero
    ends = torch.tensor([0.0, 1.0 - 2**-24, 0.0, 1.0 - 2**-24])
    tokens, _ = ops.sample_by_blocks(logits.to(DEVICE), ends.to(DEVICE), 1.0, *no_ban(vocab), False)
    assert tokens.tolist() == [5, 17, 5, 17]


@needs_kernels
def test_banned_tokens_are_excluded_while_blocked_and_keep_their_log_probability():
    ops = kernels()
    rows, vocab = 32, 300
    logits = torch.zeros(rows, vocab)
    logits[:, 7] = 12.0  # EOS takes almost all the mass
    uniforms = torch.linspace(0, 0.999, rows)
    banned = torch.zeros(vocab, dtype=torch.bool)
    banned[7] = True
    on_device = logits.to(DEVICE), uniforms.to(DEVICE), 1.0, banned.to(DEVICE)
    blocked, _ = ops.sample_by_blocks(*on_device, torch.tensor(True, device=DEVICE), True)
    assert (blocked != 7).all()
    free, logprobs = ops.sample_by_blocks(*on_device, torch.tensor(False, device=DEVICE), True)
    assert (free == 7).sum() > rows * 0.9
    # The log-probability is the one before the ban, what a teacher-forced pass computes.
    _, blocked_logprobs = ops.sample_by_blocks(*on_device, torch.tensor(True, device=DEVICE), True)
    expected = logits.log_softmax(-1).gather(1, blocked.cpu()[:, None]).squeeze(1)
    torch.testing.assert_close(blocked_logprobs.cpu(), expected, rtol=0, atol=1e-5)


@needs_kernels
def test_bad_inputs_raise_naming_the_argument():
    ops = kernels()
    logits = torch.zeros(3, 10, device=DEVICE)
    uniforms = torch.zeros(3, device=DEVICE)
    banned, blocked = no_ban(10)
    with pytest.raises(ValueError, match="uniforms must be"):
        ops.sample_by_blocks(logits, uniforms[:2], 1.0, banned, blocked, False)
    with pytest.raises(ValueError, match="banned must be"):
        ops.sample_by_blocks(logits, uniforms, 1.0, banned.int(), blocked, False)
    with pytest.raises(ValueError, match="logits must be"):
        ops.sample_by_blocks(logits.t(), uniforms, 1.0, banned, blocked, False)
    with pytest.raises(ValueError, match="temperature must be positive"):
        ops.sample_by_blocks(logits, uniforms, 0.0, banned, blocked, False)


# -------------------------------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    tokenizer = build_char_tokenizer()
    config = tiny_config(
        tokenizer, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, initializer_range=0.3
    )
    path = save_tiny_model(tmp_path_factory.mktemp("tiny_qwen2_sampling_kernel"), tokenizer, config, seed=1)
    return AutoModelForCausalLM.from_pretrained(path).to(DEVICE).eval(), tokenizer


@needs_kernels
def test_keyed_rollouts_on_the_kernels_are_the_pytorch_draw(qwen2):
    """Keyed sampling is inverse-CDF sampling either way: the same tokens and log-probabilities,
    with EOS blocked for the first steps (``min_new_tokens``) and a temperature."""
    model, tokenizer = qwen2
    batch = tokenizer(["1+2=", "37+45=", "(1)", "9"] * 3, return_tensors="pt", padding=True)
    ids, mask = batch["input_ids"].to(DEVICE), batch["attention_mask"].to(DEVICE)
    keys = torch.arange(ids.size(0), device=DEVICE) * 7919 + 3
    eos = int(model(input_ids=ids[:1]).logits[0, -1].argmax())  # likely early: the block matters
    sampling = SamplingParams(12, temperature=0.8, min_new_tokens=4)
    draws = {}
    for on_kernel in (True, False):
        generator = StaticCacheGenerator(model, ids.size(0), 32, sampling_kernel=on_kernel)
        draws[on_kernel] = generator.generate(ids, mask, sampling, eos, tokenizer.pad_token_id, keys, return_logprobs=True)
        assert (generator._sampling_ops is not None) == on_kernel
    (tokens, logprobs), (expected_tokens, expected_logprobs) = draws[True], draws[False]
    assert torch.equal(tokens, expected_tokens)
    assert (tokens[:, :4] != eos).all() and (tokens == eos).any(), "EOS should be blocked, then drawn"
    torch.testing.assert_close(logprobs, expected_logprobs, rtol=0, atol=1e-5)


def test_sampling_kernel_true_raises_where_it_cannot_run(qwen2):
    if RUNS_HERE:
        pytest.skip("the kernels run here")
    model, tokenizer = qwen2
    batch = tokenizer(["1+2="], return_tensors="pt")
    generator = StaticCacheGenerator(model, 1, 16, sampling_kernel=True)
    with pytest.raises(ValueError, match="sampling_kernel=True needs Triton and a CUDA device"):
        generator.generate(batch["input_ids"], batch["attention_mask"], SamplingParams(2), None, 0)
