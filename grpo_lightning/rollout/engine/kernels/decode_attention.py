"""A Triton kernel for the attention of a decode step: one query per row over a masked KV cache.

At a decode step each row of the batch has one query token, so attention is a matrix-vector product
per head over the cache: little arithmetic, and latency-bound in the general-purpose kernels, which
take many times longer than reading the cache does. This kernel is
written for that case, with grouped-query attention (``Hq = g * Hkv`` query heads) in mind:

* one program per ``(row, KV head)`` reads that head's keys and values once, in blocks of
  ``BLOCK_L`` cache slots, for all ``g`` query heads of its group (stacked as the rows of one
  ``[g, D] @ [D, BLOCK_L]`` product, padded to 16 rows for ``tl.dot``);
* the softmax is computed online (running maximum ``m``, normaliser ``l``), in fp32, as in
  FlashAttention (Dao et al. 2022, Algorithm 1): ``out = sum_j exp(s_j - m) v_j / sum_j exp(s_j - m)``
  with ``s_j = scale * q . k_j``, masked slots at ``-inf`` (a boolean mask) or shifted by an
  additive one;
* a row whose every slot is masked gives zeros, as SDPA does;
* with fewer ``(row, KV head)`` pairs than the GPU has multiprocessors (few rows, long caches),
  each pair's cache is split in contiguous parts, one program each, which write their partial
  sums, maximum and normaliser; a second kernel rescales them to the overall maximum and adds them
  up (FlashDecoding's reduction, Dao et al. 2023), as the loop itself does block by block;
* inside ``with slots_in_use(n)`` only the first ``n`` cache slots are read: a decode step's later
  slots are not written yet, and the engine captures one CUDA graph per bound on them.

``decode_attention(query, key, value, mask, scale)`` takes the layouts of
``grpo_lightning.rollout.engine.attention``: ``query`` ``[B, Hkv, g, D]`` (the query heads of each group stacked),
``key``/``value`` ``[B, Hkv, L, D]``, ``mask`` ``None`` or broadcastable to ``[B, Hkv, g, L]``,
and returns ``[B, Hkv, g, D]`` in the query's dtype. Any strides are accepted, so the cache is read
in place. It is registered as the custom operator ``grpo_lightning::decode_attention``
(``torch.library.custom_op``): ``torch.compile`` calls it as it is, between the kernels it
generates, and a CUDA graph captures its launch like theirs.

Importing this module needs Triton; the kernel itself runs on CUDA, or anywhere under Triton's
interpreter (``TRITON_INTERPRET=1``, which the CPU tests use).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import custom_op

from grpo_lightning.rollout.engine.kernels.availability import TRITON_INTERPRETED
from grpo_lightning.rollout.engine.kernels.common import dot, dot_precision

BLOCK_L = 64
"""Cache slots per block of the kernel's loop."""

# Warps per program and software-pipelining stages of the kernel's loop: Triton's defaults
# (benchmarks/studies/decode_attention_configs.py compares the others).
DECODE_NUM_WARPS = 4
DECODE_NUM_STAGES = 3

_MIN_DOT = 16  # tl.dot needs at least 16 rows and columns

_slot_limit: int | None = None  # set by slots_in_use, read at each launch


@contextlib.contextmanager
def slots_in_use(limit: int | None) -> Iterator[None]:
    """Inside the ``with`` block, :func:`decode_attention` reads only the first ``limit`` cache slots
    (``None``: all of them); the previous limit is restored on exit.

    For a decode step whose cache holds ``limit`` slots or fewer so far: the later ones are masked
    anyway, and skipping them leaves the result unchanged bit for bit (a block of masked slots adds
    nothing to the online softmax), while the kernel reads and loops over fewer blocks. The limit
    is read when the kernel is launched, not when ``torch.compile`` traces the operator, so one
    compiled step serves every limit, and a CUDA graph captured inside the block keeps its limit.
    The caller promises that no slot at or after ``limit`` may be attended to."""
    global _slot_limit
    if limit is not None and limit < 1:
        raise ValueError(f"slots_in_use: limit must be at least 1, got {limit}")
    previous, _slot_limit = _slot_limit, limit
    try:
        yield
    finally:
        _slot_limit = previous


@triton.jit
def _decode_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    mask_ptr,
    out_ptr,
    part_acc_ptr,
    part_stats_ptr,
    q_strides_b, q_strides_h, q_strides_g, q_strides_d,
    k_strides_b, k_strides_h, k_strides_l, k_strides_d,
    v_strides_b, v_strides_h, v_strides_l, v_strides_d,
    m_strides_b, m_strides_h, m_strides_g, m_strides_l,
    o_strides_b, o_strides_h, o_strides_g, o_strides_d,
    group,
    kv_len,
    head_dim,
    scale,
    chunk,  # cache slots per split (a multiple of BLOCK)
    GROUP_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    MASK_KIND: tl.constexpr,  # 0: none, 1: boolean (True may attend), 2: additive
    SPLIT: tl.constexpr,  # whether the cache is split over programs: write partial results
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    splits = tl.num_programs(2)
    queries = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, DIM_PAD)
    query_ok = queries < group
    dim_ok = dims < head_dim

    q = tl.load(
        q_ptr + row * q_strides_b + head * q_strides_h + queries[:, None] * q_strides_g + dims[None, :] * q_strides_d,
        mask=query_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    k_base = k_ptr + row * k_strides_b + head * k_strides_h
    v_base = v_ptr + row * v_strides_b + head * v_strides_h
    m_base = mask_ptr + row * m_strides_b + head * m_strides_h + queries[:, None] * m_strides_g

    running_max = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    normaliser = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], dtype=tl.float32)
    first = split * chunk
    stop = tl.minimum(first + chunk, kv_len)
    for start in range(first, stop, BLOCK):
        slots = start + tl.arange(0, BLOCK)
        slot_ok = slots < stop
        keys = tl.load(
            k_base + slots[:, None] * k_strides_l + dims[None, :] * k_strides_d,
            mask=slot_ok[:, None] & dim_ok[None, :],
            other=0.0,
        )  # [BLOCK, DIM_PAD]
        scores = dot(q, tl.trans(keys), PRECISION, UPCAST) * scale  # [GROUP_PAD, BLOCK], fp32
        if MASK_KIND == 1:
            allowed = tl.load(m_base + slots[None, :] * m_strides_l, mask=slot_ok[None, :], other=0)
            scores = tl.where(allowed != 0, scores, float("-inf"))
        elif MASK_KIND == 2:
            bias = tl.load(m_base + slots[None, :] * m_strides_l, mask=slot_ok[None, :], other=0.0)
            scores = scores + bias.to(tl.float32)
        scores = tl.where(slot_ok[None, :], scores, float("-inf"))

        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # all masked so far: keep exp() at 0
        weights = tl.exp(scores - shift[:, None])
        rescale = tl.exp(running_max - shift)
        normaliser = normaliser * rescale + tl.sum(weights, axis=1)
        values = tl.load(
            v_base + slots[:, None] * v_strides_l + dims[None, :] * v_strides_d,
            mask=slot_ok[:, None] & dim_ok[None, :],
            other=0.0,
        )  # [BLOCK, DIM_PAD]
        acc = acc * rescale[:, None] + dot(weights.to(values.dtype), values, PRECISION, UPCAST)
        running_max = new_max

    if SPLIT:  # partial results [B, Hkv, splits, GROUP_PAD, DIM_PAD] and (max, normaliser), for _combine_kernel
        part = (row * tl.num_programs(1) + head) * splits + split
        tl.store(part_acc_ptr + part * GROUP_PAD * DIM_PAD + queries[:, None] * DIM_PAD + dims[None, :], acc)
        tl.store(part_stats_ptr + part * 2 * GROUP_PAD + queries, running_max)
        tl.store(part_stats_ptr + part * 2 * GROUP_PAD + GROUP_PAD + queries, normaliser)
    else:
        out = acc / tl.where(normaliser > 0, normaliser, 1.0)[:, None]  # a row with nothing to attend to: 0
        tl.store(
            out_ptr + row * o_strides_b + head * o_strides_h + queries[:, None] * o_strides_g + dims[None, :] * o_strides_d,
            out.to(out_ptr.dtype.element_ty),
            mask=query_ok[:, None] & dim_ok[None, :],
        )


@triton.jit
def _combine_kernel(
    part_acc_ptr,
    part_stats_ptr,
    out_ptr,
    o_strides_b, o_strides_h, o_strides_g, o_strides_d,
    group,
    head_dim,
    splits,
    GROUP_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
):  # fmt: skip
    """The softmax of the whole cache from its splits' partial results: each split's sums are
    rescaled to the overall maximum (FlashDecoding's reduction)."""
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    queries = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, DIM_PAD)
    running_max = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    normaliser = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], dtype=tl.float32)
    for split in range(0, splits):
        part = (row * tl.num_programs(1) + head) * splits + split
        part_max = tl.load(part_stats_ptr + part * 2 * GROUP_PAD + queries)
        part_normaliser = tl.load(part_stats_ptr + part * 2 * GROUP_PAD + GROUP_PAD + queries)
        part_acc = tl.load(part_acc_ptr + part * GROUP_PAD * DIM_PAD + queries[:, None] * DIM_PAD + dims[None, :])
        new_max = tl.maximum(running_max, part_max)
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        old_scale = tl.exp(running_max - shift)
        part_scale = tl.exp(part_max - shift)
        normaliser = normaliser * old_scale + part_normaliser * part_scale
        acc = acc * old_scale[:, None] + part_acc * part_scale[:, None]
        running_max = new_max
    out = acc / tl.where(normaliser > 0, normaliser, 1.0)[:, None]
    tl.store(
        out_ptr + row * o_strides_b + head * o_strides_h + queries[:, None] * o_strides_g + dims[None, :] * o_strides_d,
        out.to(out_ptr.dtype.element_ty),
        mask=(queries < group)[:, None] & (dims < head_dim)[None, :],
    )


def _padded(size: int) -> int:
    return max(_MIN_DOT, triton.next_power_of_2(size))


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def cache_splits(batch: int, kv_heads: int, kv_len: int, device: torch.device, block: int = BLOCK_L) -> int:
    """How many programs share one ``(row, KV head)``'s cache. With fewer ``(row, KV head)`` pairs
    than the CUDA device has multiprocessors, enough for two programs per multiprocessor (at most
    one per block of ``block`` slots, the kernel's loop step); else 1, as on other devices: with few
    pairs, most multiprocessors would otherwise idle, while with many the second kernel's pass over
    the partial results costs more than it gains."""
    pairs = batch * kv_heads
    if device.type != "cuda" or pairs >= _multiprocessors(device):
        return 1
    return max(1, min(-(-2 * _multiprocessors(device) // pairs), -(-kv_len // block)))


@custom_op("grpo_lightning::decode_attention", mutates_args=())
def decode_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, scale: float, splits: int = 0
) -> Tensor:
    """``softmax(scale * query @ key^T [+ mask]) @ value`` per ``(row, KV head)``; see the module
    docstring for the shapes. ``mask``: boolean (``True`` may attend) or additive, broadcastable to
    ``[B, Hkv, g, L]``. ``splits``: how many programs share a row and KV head's cache, each a
    contiguous part, their results combined by a second kernel (``0``: :func:`cache_splits`)."""
    return launch_decode_attention(query, key, value, mask, scale, splits)


def launch_decode_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    scale: float,
    splits: int = 0,
    block: int = BLOCK_L,
    num_warps: int = DECODE_NUM_WARPS,
    num_stages: int = DECODE_NUM_STAGES,
) -> Tensor:
    """:func:`decode_attention` with the kernel's launch settings as arguments (``block``: cache
    slots per step of its loop), for ``benchmarks/studies/decode_attention_configs.py`` to compare."""
    batch, kv_heads, group, head_dim = query.shape
    kv_len = key.shape[2]
    if key.shape[:2] != (batch, kv_heads) or value.shape[:3] != key.shape[:3]:
        raise ValueError(
            f"decode_attention: query {tuple(query.shape)}, key {tuple(key.shape)} and value "
            f"{tuple(value.shape)} do not share batch, KV heads and length"
        )
    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    if mask is not None:
        mask = mask.expand(batch, kv_heads, group, kv_len)
    if _slot_limit is not None and _slot_limit < kv_len:  # slots_in_use: the first slots alone
        kv_len = _slot_limit
        mask = None if mask is None else mask[..., :kv_len]
    if mask is None:
        mask_kind, mask, mask_strides = 0, query, (0, 0, 0, 0)
    else:
        mask_kind = 1 if mask.dtype == torch.bool else 2
        mask_strides = mask.stride()
    precision = dot_precision(query.dtype)
    group_pad, dim_pad = _padded(group), _padded(head_dim)
    blocks = -(-kv_len // block)
    splits = min(splits or cache_splits(batch, kv_heads, kv_len, query.device, block), max(blocks, 1))
    chunk = max(1, -(-blocks // splits)) * block  # an empty cache: one part of no slot
    splits = max(1, -(-kv_len // chunk))  # no empty split
    part_acc = part_stats = out
    if splits > 1:
        part_acc = torch.empty(batch, kv_heads, splits, group_pad, dim_pad, device=query.device, dtype=torch.float32)
        part_stats = torch.empty(batch, kv_heads, splits, 2, group_pad, device=query.device, dtype=torch.float32)
    _decode_attention_kernel[(batch, kv_heads, splits)](
        query,
        key,
        value,
        mask,
        out,
        part_acc,
        part_stats,
        *query.stride(),
        *key.stride(),
        *value.stride(),
        *mask_strides,
        *out.stride(),
        group,
        kv_len,
        head_dim,
        scale,
        chunk,
        GROUP_PAD=group_pad,
        DIM_PAD=dim_pad,
        BLOCK=block,
        MASK_KIND=mask_kind,
        SPLIT=splits > 1,
        PRECISION=precision,
        UPCAST=TRITON_INTERPRETED,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if splits > 1:
        _combine_kernel[(batch, kv_heads)](
            part_acc, part_stats, out, *out.stride(), group, head_dim, splits, GROUP_PAD=group_pad, DIM_PAD=dim_pad
        )
    return out


@decode_attention.register_fake
def _(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, scale: float, splits: int = 0) -> Tensor:
    return torch.empty_like(query, memory_format=torch.contiguous_format)
