"""Triton kernels for a decode layer's matrix products, each fused with the element-wise work around it.

At a decode step a layer of a Llama-family model is, for ``x`` ``[B, H]`` (one token per row)::

    q, k, v = rope(rms_norm(x) @ W_qkv^T + b_qkv)       -> k, v written to the cache
    x = x + attention(q, cache) @ W_o^T
    a = silu(rms_norm(x) @ W_gate^T) * (rms_norm(x) @ W_up^T)
    x = x + a @ W_down^T

In the compiled step each line is a matrix product plus one to three small kernels (the norm, the
rotary embedding and cache write, the activation, the residual sum), each 2 to 4 us however little it
reads. The kernels here do a line each (attention stays ``grpo_lightning.decode_kernel``'s):

* :func:`product_plus_residual`: ``x + a @ W^T (+ bias)``, and the next norm's input (below);
* :func:`gained_qkv_rope`: the q/k/v product, bias, norm scale, rotary embedding of q and k, and the
  write of k and v to the cache at ``cache_position``; returns q;
* :func:`gained_gated_product`: the gate and up products, norm scale and ``silu(gate) * up``.

**The norm, split across two kernels.** ``rms_norm(x) @ W^T = r * ((x * g) @ W^T)``, with ``g`` the
norm's weight and ``r = 1 / sqrt(mean(x^2) + eps)`` one number per row. The kernel that produces ``x``
(the residual sum) also stores ``x * g`` and, for each block of ``SQUARES_BLOCK`` columns, the sum of
``x^2`` over the block (:func:`gain_inputs` computes the same in PyTorch, for the first layer); the
kernel that consumes it runs a plain product over ``x * g`` and scales each row by ``r``, computed
from those partial sums, at the end. The norm costs no pass of its own, and the products' loops load
their operands as they are (a norm computed inside the loop measured three times slower).

**Pairs of column blocks.** The rotary embedding mixes the two halves of each head
(``q * cos + rotate_half(q) * sin``) and the activation mixes gate and up columns, so a program of the
last two kernels computes two ``[rows, N]`` blocks at once (the halves of one head; the same columns
of gate and of up) and combines them before storing.

**The split sum.** ``a @ W_down^T`` sums over ``K = 4864`` in W1 and has few output columns (896), so
the programs of :func:`product_plus_residual` may each take a part of ``K`` (split-K). Each stores its
partial sum, then counts itself in on its output tile with an atomic add; the last one to arrive adds
the parts in a fixed order (so results do not depend on who arrives last), finishes the tile and
sets the count back to 0 for the next call.

Rounding follows ``transformers``: each product's output is rounded to the model's dtype before the
rotary embedding, the activation or the residual sum; the norm's scale is applied in fp32 to the
product instead of to ``x`` (rounding-level differences in bf16, none in fp32).

Importing this module needs Triton; the kernels run on CUDA, or anywhere under Triton's interpreter
(``TRITON_INTERPRET=1``, which the CPU tests use). Each is a custom operator
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

from .attention import TRITON_INTERPRETED
from .decode_kernel import _dot

SQUARES_BLOCK = 32
"""Columns of ``x`` per partial sum of squares (and the column tile of :func:`product_plus_residual`)."""


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
        left += _dot(a, w_left, PRECISION, UPCAST)
        right += _dot(a, w_right, PRECISION, UPCAST)
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


@triton.jit
def _gained_gated_kernel(
    a_ptr, squares_ptr, w_ptr, b_ptr, out_ptr,
    rows, hidden, parts, eps, inner,
    a_stride, squares_stride, w_stride, out_stride,
    HAS_BIAS: tl.constexpr, PARTS_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Columns ``[n, n + BLOCK_N)`` of ``silu(gate) * up``; ``W`` is ``[W_gate; W_up]``, ``[2 * inner, hidden]``."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    col_ok = cols < inner
    cols = tl.where(col_ok, cols, 0)  # columns past the end read row 0 and are not stored
    gate, up = _product_pair(
        a_ptr, a_stride, w_ptr, w_stride, rows, hidden, offs_m, cols, cols + inner,
        BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, UPCAST,
    )  # fmt: skip
    scale = _row_scale(squares_ptr, squares_stride, parts, offs_m, rows, hidden, eps, PARTS_PAD)[:, None]
    gate, up = gate * scale, up * scale
    if HAS_BIAS:
        gate += tl.load(b_ptr + cols).to(tl.float32)[None, :]
        up += tl.load(b_ptr + inner + cols).to(tl.float32)[None, :]
    dtype = out_ptr.dtype.element_ty
    gate, up = gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32)
    activated = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    out = out_ptr + offs_m.to(tl.int64)[:, None] * out_stride + cols[None, :]
    tl.store(out, (activated * up).to(dtype), mask=(offs_m < rows)[:, None] & col_ok[None, :])


@triton.jit
def _product_plus_residual_kernel(
    x_ptr, w_ptr, b_ptr, residual_ptr, out_ptr, gain_ptr, gained_ptr, squares_ptr, partial_ptr, count_ptr,
    rows, n_out, k_in,
    x_stride, w_stride, residual_stride, out_stride, gained_stride, squares_stride,
    HAS_BIAS: tl.constexpr, HAS_GAIN: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Tile ``(program 0, program 1)`` of ``residual + x @ W^T (+ bias)``, part ``program 2`` of ``K``;
    with ``HAS_GAIN`` also the tile of ``out * gain`` and its rows' sums of squares (column ``program 0``)."""
    tile_n, tile_m, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    col_ok, row_ok = cols < n_out, offs_m < rows
    safe_cols = tl.where(col_ok, cols, 0)
    rows64 = offs_m.to(tl.int64)[:, None]
    chunk = tl.cdiv(tl.cdiv(k_in, SPLIT), BLOCK_K) * BLOCK_K
    first = part * chunk
    stop = tl.minimum(first + chunk, k_in)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(first, stop, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        k_ok = ks < stop
        x = tl.load(x_ptr + rows64 * x_stride + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + safe_cols[None, :] * w_stride + ks[:, None], mask=k_ok[:, None], other=0.0)
        acc += _dot(x, w, PRECISION, UPCAST)
    finish = True
    if SPLIT > 1:
        tile = tile_m * tl.num_programs(0) + tile_n
        parts = partial_ptr + (tile * SPLIT).to(tl.int64) * BLOCK_M * BLOCK_N
        block = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tl.store(parts + part * BLOCK_M * BLOCK_N + block, acc, cache_modifier=".cg")
        tl.debug_barrier()  # every thread's partial sum is stored before the count says so
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        finish = arrived == SPLIT - 1
        if finish:  # the last part in: add all parts, in order
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for other in range(0, SPLIT):
                acc += tl.load(parts + other * BLOCK_M * BLOCK_N + block, cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed", scope="gpu")
    if finish:
        if HAS_BIAS:
            acc += tl.load(b_ptr + safe_cols).to(tl.float32)[None, :]
        dtype = out_ptr.dtype.element_ty
        ok = row_ok[:, None] & col_ok[None, :]
        residual = tl.load(residual_ptr + rows64 * residual_stride + cols[None, :], mask=ok, other=0.0)
        total = (residual.to(tl.float32) + acc.to(dtype).to(tl.float32)).to(dtype)
        tl.store(out_ptr + rows64 * out_stride + cols[None, :], total, mask=ok)
        if HAS_GAIN:  # the next norm's input: out * gain, and the sums of out^2 over this tile's columns
            total = tl.where(ok, total.to(tl.float32), 0.0)
            gain = tl.load(gain_ptr + safe_cols).to(tl.float32)
            tl.store(gained_ptr + rows64 * gained_stride + cols[None, :], (total * gain[None, :]).to(dtype), mask=ok)
            tl.store(squares_ptr + offs_m.to(tl.int64) * squares_stride + tile_n, tl.sum(total * total, axis=1), mask=row_ok)


def _configs(**choices: list[int]) -> list[triton.Config]:
    """Every combination of ``choices`` (meta-parameters, plus ``num_warps`` and ``num_stages``)."""
    configs = [{}]
    for name, values in choices.items():
        configs = [{**config, name: value} for config in configs for value in values]
    return [
        triton.Config(
            {k: v for k, v in c.items() if k not in ("num_warps", "num_stages")},
            num_warps=c.get("num_warps", 4),
            num_stages=c.get("num_stages", 3),
        )
        for c in configs
    ]


_QKV_CONFIGS = _configs(BLOCK_M=[32, 64, 128], BLOCK_K=[64, 128], num_stages=[3, 4])
_GATED_CONFIGS = _configs(BLOCK_M=[64, 128], BLOCK_N=[32, 64], BLOCK_K=[64, 128], num_stages=[3, 4])
_PRODUCT_CONFIGS = _configs(BLOCK_M=[64, 128], BLOCK_K=[64, 128], SPLIT=[1, 2, 4, 8])
_INTERPRETED_META = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}
_MAX_SPLIT = 8

_qkv_tuned = triton.autotune(_QKV_CONFIGS, key=["rows", "hidden", "q_heads", "kv_heads"])(_gained_qkv_rope_kernel)
_gated_tuned = triton.autotune(_GATED_CONFIGS, key=["rows", "hidden", "inner"])(_gained_gated_kernel)
_product_tuned = triton.autotune(_PRODUCT_CONFIGS, key=["rows", "n_out", "k_in"])(_product_plus_residual_kernel)


def _check_rows_contiguous(**tensors: Tensor | None) -> None:
    """The kernels take one stride per dimension but the last, which must be 1."""
    for name, tensor in tensors.items():
        if tensor is not None and tensor.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension, got strides {tensor.stride()}")


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def _parts_pad(squares: Tensor) -> int:
    return max(triton.next_power_of_2(squares.shape[1]), 2)


_counts: dict[tuple[torch.device, int], Tensor] = {}


def _tile_counts(device: torch.device, tiles: int) -> Tensor:
    """Zeroed int32 counters for the split sum, kept for the process's life: a CUDA graph holds their
    address, and the kernel leaves them at 0 after every call."""
    size = max(1024, triton.next_power_of_2(tiles))
    key = (device, size)
    if key not in _counts:
        _counts[key] = torch.zeros(size, dtype=torch.int32, device=device)
    return _counts[key]


def gain_inputs(x: Tensor, gain: Tensor) -> tuple[Tensor, Tensor]:
    """The norm inputs that :func:`product_plus_residual` stores, for an ``x`` ``[B, H]`` that no such
    kernel produced (the first layer's): ``x * gain`` in ``x``'s dtype, and the sums of ``x^2`` over
    each block of ``SQUARES_BLOCK`` columns, ``[B, ceil(H / SQUARES_BLOCK)]`` in fp32."""
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
        "PRECISION": _precision(gained.dtype),
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


@custom_op("grpo_lightning::gained_gated_product", mutates_args=())
def gained_gated_product(gained: Tensor, squares: Tensor, eps: float, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``silu(gate) * up`` ``[B, I]`` with ``[gate, up] = rms_norm(x) @ weight^T (+ bias)``, from
    ``gained``/``squares`` (:func:`gain_inputs`); ``weight`` ``[2 I, H]`` is the gate rows, then the up
    rows."""
    _check_rows_contiguous(gained=gained, squares=squares, weight=weight, bias=bias)
    rows, hidden = gained.shape
    inner = weight.shape[0] // 2
    out = gained.new_empty(rows, inner)
    args = (
        gained, squares, weight, bias if bias is not None else weight, out, rows, hidden, squares.shape[1], eps, inner,
        gained.stride(0), squares.stride(0), weight.stride(0), out.stride(0),
    )  # fmt: skip
    meta = {"HAS_BIAS": bias is not None, "PARTS_PAD": _parts_pad(squares), "PRECISION": _precision(gained.dtype)}
    if TRITON_INTERPRETED:
        grid = (triton.cdiv(inner, _INTERPRETED_META["BLOCK_N"]), triton.cdiv(rows, _INTERPRETED_META["BLOCK_M"]))
        _gained_gated_kernel[grid](*args, **meta, **_INTERPRETED_META, UPCAST=True)
    else:
        _gated_tuned[lambda m: (triton.cdiv(inner, m["BLOCK_N"]), triton.cdiv(rows, m["BLOCK_M"]))](
            *args, **meta, UPCAST=False
        )
    return out


@gained_gated_product.register_fake
def _(gained, squares, eps, weight, bias):
    return gained.new_empty(gained.shape[0], weight.shape[0] // 2)


@custom_op("grpo_lightning::product_plus_residual", mutates_args=())
def product_plus_residual(
    x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor, next_gain: Tensor | None, split: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    """``out = residual + x @ weight^T (+ bias)``, the product rounded to ``x``'s dtype before the sum,
    and with ``next_gain`` the next norm's inputs ``out * next_gain`` and partial sums of ``out^2``
    (as :func:`gain_inputs` computes them; empty tensors without ``next_gain``). ``x`` ``[B, K]``,
    ``weight`` ``[N, K]``, ``residual`` ``[B, N]``. ``split``: parts of ``K`` summed by separate
    programs (``0``: tuned on CUDA, one part under the interpreter)."""
    _check_rows_contiguous(x=x, weight=weight, bias=bias, residual=residual, next_gain=next_gain)
    rows, k_in = x.shape
    n_out = weight.shape[0]
    out, gained, squares = _product_outputs(x, weight, residual, next_gain)
    meta = {"HAS_BIAS": bias is not None, "HAS_GAIN": next_gain is not None, "PRECISION": _precision(x.dtype)}
    tuned = not TRITON_INTERPRETED and split == 0
    block_m, block_k = (_INTERPRETED_META["BLOCK_M"], _INTERPRETED_META["BLOCK_K"]) if TRITON_INTERPRETED else (64, 64)
    parts = _MAX_SPLIT if tuned else max(split, 1)
    # Partial sums: tiles x parts x tile, at most the output padded to 128 (every block size divides it).
    padded = triton.cdiv(rows, 128) * 128 * triton.cdiv(n_out, 128) * 128
    counts = _tile_counts(x.device, triton.cdiv(rows, 16) * triton.cdiv(n_out, SQUARES_BLOCK))
    partial = x.new_empty(padded * parts if parts > 1 else 1, dtype=torch.float32)
    args = (
        x, weight, bias if bias is not None else weight, residual, out,
        next_gain if next_gain is not None else weight, gained if next_gain is not None else out,
        squares if next_gain is not None else partial, partial, counts, rows, n_out, k_in,
        x.stride(0), weight.stride(0), residual.stride(0), out.stride(0),
        gained.stride(0) if next_gain is not None else 0, squares.stride(0) if next_gain is not None else 0,
    )  # fmt: skip
    if tuned:
        _product_tuned[lambda m: (triton.cdiv(n_out, SQUARES_BLOCK), triton.cdiv(rows, m["BLOCK_M"]), m["SPLIT"])](
            *args, **meta, BLOCK_N=SQUARES_BLOCK, UPCAST=False
        )
    else:
        grid = (triton.cdiv(n_out, SQUARES_BLOCK), triton.cdiv(rows, block_m), parts)
        _product_plus_residual_kernel[grid](
            *args, **meta, SPLIT=parts, BLOCK_M=block_m, BLOCK_N=SQUARES_BLOCK, BLOCK_K=block_k,
            UPCAST=TRITON_INTERPRETED,
        )  # fmt: skip
    return out, gained, squares


def _product_outputs(x: Tensor, weight: Tensor, residual: Tensor, next_gain: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    out = torch.empty_like(residual, memory_format=torch.contiguous_format)
    if next_gain is None:
        return out, x.new_empty(0), x.new_empty(0, dtype=torch.float32)
    parts = triton.cdiv(weight.shape[0], SQUARES_BLOCK)
    return out, torch.empty_like(out), x.new_empty(x.shape[0], parts, dtype=torch.float32)


@product_plus_residual.register_fake
def _(x, weight, bias, residual, next_gain, split=0):
    return _product_outputs(x, weight, residual, next_gain)
