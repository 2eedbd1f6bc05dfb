"""A Triton kernel for the start of a decode layer: norm, q/k/v product, rotary embedding and cache write.

At a decode step a layer of a Llama-family model begins, for ``x`` ``[B, H]`` (one token per row)::

    q, k, v = rope(rms_norm(x) @ W_qkv^T + b_qkv)       -> k, v written to the cache

which the compiled step runs as the norm (fused with the previous residual sum), the product, and one
or two kernels for the rotary embedding and the cache write. :func:`gained_qkv_rope` does it in one
kernel, which saves the launches and the round trips of q, k and v through memory.

**The norm, split in two.** ``rms_norm(x) @ W^T = r * ((x * g) @ W^T)``, with ``g`` the norm's weight
and ``r = 1 / sqrt(mean(x^2) + eps)`` one number per row. :func:`gain_inputs` computes ``x * g`` and
the sums of ``x^2`` over blocks of ``SQUARES_BLOCK`` columns in PyTorch, where ``torch.compile`` fuses
them into the residual sum that produces ``x``; the kernel's loop is a plain product over ``x * g``
and each row is scaled by ``r`` at the end, which keeps the norm's reduction out of the loop.

**Each program takes one head** (the q heads, then k, then v of ``W_qkv``'s rows) for a block of rows,
as two ``[rows, D / 2]`` products, the halves of the head, which the rotary embedding mixes
(``q * cos + rotate_half(q) * sin``). q is returned; k and v are stored in the cache at
``cache_position``.

Rounding follows ``transformers``: the product's output (bias included) is rounded to the model's
dtype before the rotary embedding; the norm's scale is applied in fp32 to the product instead of to
``x`` (rounding-level differences in bf16, none in fp32).

Importing this module needs Triton; the kernel runs on CUDA, or anywhere under Triton's interpreter
(``TRITON_INTERPRET=1``, which the CPU tests use). It is a custom operator
(``torch.library.custom_op``), so ``torch.compile`` calls it as it is and a CUDA graph captures it.
Block sizes are tuned on first use for each shape (``triton.autotune``) on CUDA; one fixed choice is
used under the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import custom_op

from grpo_lightning.rollout.engine.kernels.availability import TRITON_INTERPRETED
from grpo_lightning.rollout.engine.kernels.common import dot, dot_precision

SQUARES_BLOCK = 32
"""Columns of ``x`` per partial sum of squares."""


@triton.jit
def _product_pair(
    a_ptr, a_stride, w_ptr, w_stride, rows, k_in, offs_m, left_cols, right_cols,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """``a @ W[left_cols]^T`` and ``a @ W[right_cols]^T`` for rows ``offs_m``, in fp32."""
    row_ok = offs_m < rows
    rows64 = offs_m.to(tl.int64)[:, None]
    left = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    right = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, k_in, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        k_ok = ks < k_in
        a = tl.load(a_ptr + rows64 * a_stride + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_left = tl.load(w_ptr + left_cols[None, :] * w_stride + ks[:, None], mask=k_ok[:, None], other=0.0)
        w_right = tl.load(w_ptr + right_cols[None, :] * w_stride + ks[:, None], mask=k_ok[:, None], other=0.0)
        left += dot(a, w_left, PRECISION, UPCAST)
        right += dot(a, w_right, PRECISION, UPCAST)
    return left, right


@triton.jit
def _row_scale(squares_ptr, squares_stride, parts, offs_m, rows, hidden, eps, PARTS_PAD: tl.constexpr):
    """``1 / sqrt(mean(x^2) + eps)`` of rows ``offs_m`` from their partial sums of squares."""
    cols = tl.arange(0, PARTS_PAD)
    ok = (offs_m < rows)[:, None] & (cols < parts)[None, :]
    sums = tl.load(squares_ptr + offs_m.to(tl.int64)[:, None] * squares_stride + cols[None, :], mask=ok, other=0.0)
    return 1.0 / tl.sqrt(tl.sum(sums, axis=1) / hidden + eps)


@triton.jit
def _gained_qkv_rope_kernel(
    a_ptr, squares_ptr, w_ptr, b_ptr, cos_ptr, sin_ptr, q_ptr, k_cache_ptr, v_cache_ptr, position_ptr,
    rows, hidden, parts, eps, q_heads, kv_heads,
    a_stride, squares_stride, w_stride, cos_stride, sin_stride,
    q_stride_b, q_stride_h,
    k_stride_b, k_stride_h, k_stride_l,
    v_stride_b, v_stride_h, v_stride_l,
    HAS_BIAS: tl.constexpr, HALF: tl.constexpr, PARTS_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One head (of the ``q_heads + 2 * kv_heads`` heads of ``W_qkv``'s rows) for ``BLOCK_M`` rows."""
    head = tl.program_id(0)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    halves = tl.arange(0, HALF)
    left_cols = head * 2 * HALF + halves
    right_cols = left_cols + HALF
    first, second = _product_pair(
        a_ptr, a_stride, w_ptr, w_stride, rows, hidden, offs_m, left_cols, right_cols,
        BLOCK_M, HALF, BLOCK_K, PRECISION, UPCAST,
    )  # fmt: skip
    scale = _row_scale(squares_ptr, squares_stride, parts, offs_m, rows, hidden, eps, PARTS_PAD)[:, None]
    first, second = first * scale, second * scale
    if HAS_BIAS:
        first += tl.load(b_ptr + left_cols).to(tl.float32)[None, :]
        second += tl.load(b_ptr + right_cols).to(tl.float32)[None, :]
    dtype = q_ptr.dtype.element_ty
    first, second = first.to(dtype).to(tl.float32), second.to(dtype).to(tl.float32)  # the product's output
    row_ok = (offs_m < rows)[:, None]
    rows64 = offs_m.to(tl.int64)[:, None]
    if head < q_heads + kv_heads:  # q or k: the rotary embedding, q * cos + rotate_half(q) * sin
        cos_first = tl.load(cos_ptr + rows64 * cos_stride + halves[None, :], mask=row_ok, other=0.0).to(tl.float32)
        cos_second = tl.load(cos_ptr + rows64 * cos_stride + HALF + halves[None, :], mask=row_ok, other=0.0)
        sin_first = tl.load(sin_ptr + rows64 * sin_stride + halves[None, :], mask=row_ok, other=0.0).to(tl.float32)
        sin_second = tl.load(sin_ptr + rows64 * sin_stride + HALF + halves[None, :], mask=row_ok, other=0.0)
        first, second = (
            first * cos_first - second * sin_first,
            second * cos_second.to(tl.float32) + first * sin_second.to(tl.float32),
        )
    if head < q_heads:
        target = q_ptr + rows64 * q_stride_b + head * q_stride_h + halves[None, :]
    else:
        position = tl.load(position_ptr).to(tl.int64)
        if head < q_heads + kv_heads:
            kv_head = head - q_heads
            target = k_cache_ptr + rows64 * k_stride_b + kv_head * k_stride_h + position * k_stride_l + halves[None, :]
        else:
            kv_head = head - q_heads - kv_heads
            target = v_cache_ptr + rows64 * v_stride_b + kv_head * v_stride_h + position * v_stride_l + halves[None, :]
    tl.store(target, first.to(dtype), mask=row_ok)
    tl.store(target + HALF, second.to(dtype), mask=row_ok)


_QKV_CONFIGS = [
    triton.Config({"BLOCK_M": block_m, "BLOCK_K": block_k}, num_warps=4, num_stages=stages)
    for block_m in (32, 64, 128)
    for block_k in (64, 128)
    for stages in (3, 4)
]
_INTERPRETED_META = {"BLOCK_M": 16, "BLOCK_K": 16}

_qkv_tuned = triton.autotune(_QKV_CONFIGS, key=["rows", "hidden", "q_heads", "kv_heads"])(_gained_qkv_rope_kernel)


def _check_rows_contiguous(**tensors: Tensor | None) -> None:
    """The kernel takes one stride per dimension but the last, which must be 1."""
    for name, tensor in tensors.items():
        if tensor is not None and tensor.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension, got strides {tensor.stride()}")


def _parts_pad(squares: Tensor) -> int:
    return max(triton.next_power_of_2(squares.shape[1]), 2)


def gain_inputs(x: Tensor, gain: Tensor) -> tuple[Tensor, Tensor]:
    """The inputs of :func:`gained_qkv_rope` for the norm ``rms_norm(x) * gain`` of ``x`` ``[B, H]``:
    ``x * gain`` in ``x``'s dtype, and the sums of ``x^2`` over each block of ``SQUARES_BLOCK``
    columns, ``[B, ceil(H / SQUARES_BLOCK)]`` in fp32. Written in PyTorch, so that ``torch.compile``
    fuses it into the kernel that computes ``x`` (the previous layer's residual sum)."""
    rows, hidden = x.shape
    values = x.float()
    padded = torch.nn.functional.pad(values * values, (0, -hidden % SQUARES_BLOCK))
    return (values * gain.float()).to(x.dtype), padded.view(rows, -1, SQUARES_BLOCK).sum(-1)


@custom_op("grpo_lightning::gained_qkv_rope", mutates_args=("key_cache", "value_cache"))
def gained_qkv_rope(
    gained: Tensor,
    squares: Tensor,
    eps: float,
    weight: Tensor,
    bias: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    cache_position: Tensor,
    q_heads: int,
) -> Tensor:
    """``q`` ``[B, q_heads, D]`` of ``rope(rms_norm(x) @ weight^T + bias)``; k and v go to
    ``key_cache``/``value_cache`` ``[B, Hkv, L, D]`` at slot ``cache_position[0]``.

    ``gained``, ``squares``: ``x * g`` and the partial sums of ``x^2`` (:func:`gain_inputs`);
    ``weight`` ``[(q_heads + 2 Hkv) D, H]``, the q, k and v rows stacked; ``cos`` and ``sin``
    ``[B, D]`` (the model's rotary embedding at each row's position)."""
    _check_rows_contiguous(
        gained=gained, squares=squares, weight=weight, bias=bias, cos=cos, sin=sin, key_cache=key_cache, value_cache=value_cache
    )  # fmt: skip
    rows, hidden = gained.shape
    kv_heads, head_dim = key_cache.shape[1], key_cache.shape[3]
    query = gained.new_empty(rows, q_heads, head_dim)
    heads = q_heads + 2 * kv_heads
    args = (
        gained, squares, weight, bias if bias is not None else weight, cos, sin, query, key_cache, value_cache,
        cache_position, rows, hidden, squares.shape[1], eps, q_heads, kv_heads,
        gained.stride(0), squares.stride(0), weight.stride(0), cos.stride(0), sin.stride(0),
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
    )  # fmt: skip
    meta = {
        "HAS_BIAS": bias is not None, "HALF": head_dim // 2, "PARTS_PAD": _parts_pad(squares),
        "PRECISION": dot_precision(gained.dtype),
    }  # fmt: skip
    if TRITON_INTERPRETED:
        block_m = _INTERPRETED_META["BLOCK_M"]
        _gained_qkv_rope_kernel[(heads, triton.cdiv(rows, block_m))](
            *args, **meta, BLOCK_M=block_m, BLOCK_K=_INTERPRETED_META["BLOCK_K"], UPCAST=True
        )
    else:
        _qkv_tuned[lambda m: (heads, triton.cdiv(rows, m["BLOCK_M"]))](*args, **meta, UPCAST=False)
    return query


@gained_qkv_rope.register_fake
def _(gained, squares, eps, weight, bias, cos, sin, key_cache, value_cache, cache_position, q_heads):
    return gained.new_empty(gained.shape[0], q_heads, key_cache.shape[3])


