"""Triton kernels for one decode step's draw: inverse-CDF sampling over the vocabulary in two passes.

A decode step draws one token per row from ``softmax(logits / T)`` over ``[B, V]`` logits (``V`` is
151936 for Qwen2.5). Compiled from PyTorch, the exponential race ``argmax(logits - log E)`` is one
reduction per row: one program per row, each generating and reducing ``V`` random numbers, which
leaves most of the GPU idle. Here a row needs one uniform number ``u`` and two passes that spread
over the whole GPU:

1. :func:`_block_masses_kernel`, one program per row and block of ``BLOCK`` tokens: the block's
   largest tempered logit ``m_b`` and ``s_b = sum(exp(z - m_b))`` over the tokens allowed (EOS is
   banned before ``min_new_tokens``), and the same over every token for the log-probability.
2. :func:`_draw_kernel`, one program per row: the blocks' masses ``s_b exp(m_b - M)`` and their
   cumulative sum locate ``u`` times the total mass in one block; a cumulative sum inside that block
   locates the token (the first whose cumulative mass exceeds the target). The token's
   log-probability is ``z_token - logsumexp(z)`` under the distribution before the EOS ban, as a
   teacher-forced forward pass computes it.

This is the draw of :func:`grpo_lightning.rollout.engine.inverse_cdf_sample` (the same blocks, up to the
rounding of fp32 sums), so keyed sampling (``u`` from ``engine.keyed_uniforms``) gives the same
tokens through either. A token of probability zero is never drawn, even where rounding puts the
target at or past the total mass.

Importing this module needs Triton; the kernels run on CUDA, or anywhere under Triton's interpreter
(``TRITON_INTERPRET=1``, which the CPU tests use). :func:`sample_by_blocks` is a custom operator
(``torch.library.custom_op``), so ``torch.compile`` calls it as it is and a CUDA graph captures it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import custom_op

SAMPLING_BLOCK = 2048
"""Tokens per block of the first pass (and of the scan inside the chosen block)."""

_PARTIALS = tl.constexpr(4)  # per row and block: m, s over the allowed tokens; m, s over all tokens


@triton.jit
def _max_and_sum_exp(z):
    """``(m, sum(exp(z - m)))`` of a block; ``(-inf, 0)`` when every entry is ``-inf``."""
    m = tl.max(z, axis=0)
    shift = tl.where(m == float("-inf"), 0.0, m)
    return m, tl.sum(tl.exp(z - shift), axis=0)


@triton.jit
def _tempered_block(logits_ptr, banned_ptr, blocked_ptr, row, logits_stride, vocab, inverse_temperature, cols):
    """The tempered logits ``z`` of ``cols`` (``-inf`` past the vocabulary) and whether each is banned."""
    ok = cols < vocab
    z = tl.load(logits_ptr + row.to(tl.int64) * logits_stride + cols, mask=ok, other=float("-inf")).to(tl.float32)
    banned = (tl.load(banned_ptr + cols, mask=ok, other=0) != 0) & (tl.load(blocked_ptr) != 0)
    return z * inverse_temperature, banned


@triton.jit
def _block_masses_kernel(
    logits_ptr, banned_ptr, blocked_ptr, partial_ptr, vocab, logits_stride, inverse_temperature,
    BLOCK: tl.constexpr, WITH_ALL: tl.constexpr,
):  # fmt: skip
    """Pass 1: ``m_b`` and ``s_b`` of one block of one row (see the module docstring). Only a block
    that holds a banned token while the ban is on computes them twice, with and without the ban."""
    row, block = tl.program_id(0), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    z, banned = _tempered_block(logits_ptr, banned_ptr, blocked_ptr, row, logits_stride, vocab, inverse_temperature, cols)
    out = partial_ptr + (row.to(tl.int64) * tl.num_programs(1) + block) * _PARTIALS
    if tl.max(banned.to(tl.int32), axis=0) > 0:
        m, s = _max_and_sum_exp(tl.where(banned, float("-inf"), z))
        m_all, s_all = _max_and_sum_exp(z)
    else:
        m, s = _max_and_sum_exp(z)
        m_all, s_all = m, s
    tl.store(out, m)
    tl.store(out + 1, s)
    if WITH_ALL:
        tl.store(out + 2, m_all)
        tl.store(out + 3, s_all)


@triton.jit
def _draw_kernel(
    logits_ptr, banned_ptr, blocked_ptr, partial_ptr, uniform_ptr, token_ptr, logprob_ptr,
    vocab, blocks, logits_stride, inverse_temperature,
    BLOCK: tl.constexpr, BLOCKS_PAD: tl.constexpr, WITH_LOGPROB: tl.constexpr,
):  # fmt: skip
    """Pass 2: the token of one row, and its log-probability (see the module docstring)."""
    row = tl.program_id(0)
    index = tl.arange(0, BLOCKS_PAD)
    partials = partial_ptr + (row.to(tl.int64) * blocks + index) * _PARTIALS
    block_ok = index < blocks
    m_b = tl.load(partials, mask=block_ok, other=float("-inf"))
    top = tl.max(m_b, axis=0)
    mass = tl.where(m_b == float("-inf"), 0.0, tl.load(partials + 1, mask=block_ok, other=0.0) * tl.exp(m_b - top))
    cdf = tl.cumsum(mass, axis=0)
    target = tl.load(uniform_ptr + row).to(tl.float32) * tl.max(cdf, axis=0)
    # The first block whose cumulative mass exceeds the target, never one of zero mass ...
    last_block = tl.max(tl.where(mass > 0, index, 0), axis=0)
    chosen = tl.minimum(tl.sum((cdf <= target).to(tl.int32), axis=0), last_block)
    before = tl.sum(tl.where(index == chosen, cdf - mass, 0.0), axis=0)
    # ... then the first token in it whose cumulative mass exceeds the target.
    inside = tl.arange(0, BLOCK)
    z, banned = _tempered_block(
        logits_ptr, banned_ptr, blocked_ptr, row, logits_stride, vocab, inverse_temperature, chosen * BLOCK + inside
    )  # fmt: skip
    weight = tl.where(banned, 0.0, tl.exp(z - top))
    token_cdf = tl.cumsum(weight, axis=0) + before
    last_token = tl.max(tl.where(weight > 0, inside, 0), axis=0)
    token = chosen * BLOCK + tl.minimum(tl.sum((token_cdf <= target).to(tl.int32), axis=0), last_token)
    tl.store(token_ptr + row, token.to(tl.int64))
    if WITH_LOGPROB:
        m_all = tl.load(partials + 2, mask=block_ok, other=float("-inf"))
        top_all = tl.max(m_all, axis=0)
        total = tl.sum(tl.where(m_all == float("-inf"), 0.0, tl.load(partials + 3, mask=block_ok, other=0.0) * tl.exp(m_all - top_all)), axis=0)
        chosen_logit = tl.load(logits_ptr + row.to(tl.int64) * logits_stride + token).to(tl.float32) * inverse_temperature
        tl.store(logprob_ptr + row, chosen_logit - top_all - tl.log(total))
    else:
        tl.store(logprob_ptr + row, 0.0)


def check_sampling_inputs(logits: Tensor, uniforms: Tensor, banned: Tensor, blocked: Tensor) -> None:
    """Shapes the kernels take; raises ``ValueError`` naming the argument."""
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError(f"logits must be [rows, vocabulary] with a contiguous last dimension, got {tuple(logits.shape)} with strides {logits.stride()}")
    rows, vocab = logits.shape
    if uniforms.shape != (rows,):
        raise ValueError(f"uniforms must be [rows] = [{rows}], got {tuple(uniforms.shape)}")
    if banned.shape != (vocab,) or banned.dtype != torch.bool:
        raise ValueError(f"banned must be a bool tensor [vocabulary] = [{vocab}], got {banned.dtype} {tuple(banned.shape)}")
    if blocked.numel() != 1 or blocked.dtype != torch.bool:
        raise ValueError(f"blocked must be one bool, got {blocked.dtype} {tuple(blocked.shape)}")


@custom_op("grpo_lightning::sample_by_blocks", mutates_args=())
def sample_by_blocks(
    logits: Tensor, uniforms: Tensor, temperature: float, banned: Tensor, blocked: Tensor, with_logprob: bool
) -> tuple[Tensor, Tensor]:
    """One token per row of ``softmax(logits / temperature)`` (``logits`` ``[B, V]``), the token where
    ``uniforms[b]`` (in ``[0, 1)``) falls in the row's cumulative distribution; tokens where
    ``banned`` ``[V]`` is true are excluded while ``blocked`` (one bool) is true.

    Returns the tokens ``[B]`` (int64) and, with ``with_logprob``, their log-probabilities ``[B]`` (fp32)
    under ``softmax(logits / temperature)`` without the ban (zeros otherwise)."""
    check_sampling_inputs(logits, uniforms, banned, blocked)
    if not temperature > 0:
        raise ValueError(f"temperature must be positive (greedy decoding is an argmax), got {temperature}")
    rows, vocab = logits.shape
    block = SAMPLING_BLOCK
    blocks = triton.cdiv(vocab, block)
    partials = torch.empty(rows, blocks, _PARTIALS.value, device=logits.device, dtype=torch.float32)
    tokens = torch.empty(rows, device=logits.device, dtype=torch.long)
    logprobs = torch.empty(rows, device=logits.device, dtype=torch.float32)
    flags = banned.view(torch.uint8)
    stride = logits.stride(0)
    _block_masses_kernel[(rows, blocks)](
        logits, flags, blocked, partials, vocab, stride, 1.0 / temperature, BLOCK=block, WITH_ALL=with_logprob, num_warps=8
    )
    _draw_kernel[(rows,)](
        logits, flags, blocked, partials, uniforms, tokens, logprobs, vocab, blocks, stride, 1.0 / temperature,
        BLOCK=block, BLOCKS_PAD=max(triton.next_power_of_2(blocks), 2), WITH_LOGPROB=with_logprob, num_warps=8,
    )  # fmt: skip
    return tokens, logprobs


@sample_by_blocks.register_fake
def _(logits, uniforms, temperature, banned, blocked, with_logprob):
    rows = logits.shape[0]
    return logits.new_empty(rows, dtype=torch.long), logits.new_empty(rows, dtype=torch.float32)
