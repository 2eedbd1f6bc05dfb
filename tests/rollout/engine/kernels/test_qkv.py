"""The q/k/v Triton kernel of a decode layer (``grpo_lightning.rollout.engine.kernels.qkv``) against the model's modules.

It runs on CUDA, or on the CPU under Triton's interpreter: ``test_decode_kernel.py``'s
``test_the_kernel_under_triton_s_interpreter`` runs this file in a process with
``TRITON_INTERPRET=1``. Decoding with it is tested in ``test_fused_decode.py``.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch.nn import functional as F
from transformers.models.qwen2.modeling_qwen2 import rotate_half  # the model's own

RUNS_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernels = pytest.mark.skipif(not RUNS_HERE, reason="runs on CUDA or under TRITON_INTERPRET=1 (see above)")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def kernels():
    pytest.importorskip("triton")
    from grpo_lightning.rollout.engine.kernels import qkv as qkv_kernel

    return qkv_kernel


def rms_norm(x, weight, eps):
    """transformers' Llama/Qwen2 RMS norm."""
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def randn(generator, *shape, scale=1.0, dtype=torch.float32):
    return (torch.randn(*shape, generator=generator) * scale).to(DEVICE, dtype)


# ------------------------------------------------------------------------------------------ the ops


@needs_kernels
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("rows", [1, 5, 19])
def test_gained_qkv_rope_is_norm_product_rotary_and_cache_write(rows, with_bias):
    ops = kernels()
    gen = torch.Generator().manual_seed(rows)
    hidden, q_heads, kv_heads, head_dim, slots, eps = 40, 4, 2, 32, 7, 1e-5
    x, gain = randn(gen, rows, hidden), randn(gen, hidden)
    weight = randn(gen, (q_heads + 2 * kv_heads) * head_dim, hidden, scale=0.2)
    bias = randn(gen, weight.shape[0]) if with_bias else None
    angles = randn(gen, rows, head_dim // 2, scale=3.0)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    keys = randn(gen, rows, kv_heads, slots, head_dim)
    values = randn(gen, rows, kv_heads, slots, head_dim)
    old_keys, old_values = keys.clone(), values.clone()
    position = torch.tensor([4], device=DEVICE)

    gained, squares = ops.gain_inputs(x, gain)
    query = ops.gained_qkv_rope(gained, squares, eps, weight, bias, cos, sin, keys, values, position, q_heads)

    q, k, v = F.linear(rms_norm(x, gain, eps), weight, bias).split(
        [q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1
    )
    q, k, v = (t.view(rows, -1, head_dim) for t in (q, k, v))
    q = q * cos[:, None] + rotate_half(q) * sin[:, None]
    k = k * cos[:, None] + rotate_half(k) * sin[:, None]
    torch.testing.assert_close(query, q, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(keys[:, :, 4], k, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(values[:, :, 4], v, atol=2e-5, rtol=2e-5)
    others = [0, 1, 2, 3, 5, 6]  # every other slot is untouched
    assert torch.equal(keys[:, :, others], old_keys[:, :, others])
    assert torch.equal(values[:, :, others], old_values[:, :, others])


@needs_kernels
def test_the_op_rejects_tensors_with_a_strided_last_dimension():
    ops = kernels()
    x = torch.randn(4, 64, device=DEVICE)
    gained, squares = ops.gain_inputs(x, torch.ones(64, device=DEVICE))
    cache = torch.zeros(4, 1, 8, 32, device=DEVICE)
    angles = torch.zeros(4, 32, device=DEVICE)
    with pytest.raises(ValueError, match="weight must have a contiguous last dimension"):
        ops.gained_qkv_rope(
            gained, squares, 1e-6, torch.randn(64, 128, device=DEVICE).t(), None, angles, angles, cache, cache.clone(),
            torch.tensor([0], device=DEVICE), 2,
        )  # fmt: skip


def test_gain_inputs_are_x_times_gain_and_sums_of_squares_per_block():
    ops = kernels()
    x, gain = torch.arange(70.0).view(2, 35), torch.full((35,), 2.0)
    gained, squares = ops.gain_inputs(x, gain)
    assert torch.equal(gained, 2 * x)
    assert squares.shape == (2, 2)  # 32 columns, then the other 3
    assert torch.equal(squares[:, 0], (x[:, :32] ** 2).sum(-1)) and torch.equal(squares[:, 1], (x[:, 32:] ** 2).sum(-1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 on a GPU")
def test_the_op_in_bf16_matches_the_modules_within_bf16_rounding():
    """W1's shapes: 128 rows, hidden 896, 14 query and 2 KV heads of 64."""
    ops = kernels()
    gen = torch.Generator().manual_seed(0)
    rows, hidden, q_heads, kv_heads, head_dim = 128, 896, 14, 2, 64
    bf16 = torch.bfloat16
    x, gain = randn(gen, rows, hidden, dtype=bf16), randn(gen, hidden, dtype=bf16)
    weight = randn(gen, (q_heads + 2 * kv_heads) * head_dim, hidden, scale=0.05, dtype=bf16)
    bias = randn(gen, weight.shape[0], scale=0.1, dtype=bf16)
    angles = randn(gen, rows, head_dim // 2, scale=3.0)
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(bf16), torch.cat([angles.sin()] * 2, -1).to(bf16)
    keys = torch.zeros(rows, kv_heads, 16, head_dim, device=DEVICE, dtype=bf16)
    values = torch.zeros_like(keys)
    query = ops.gained_qkv_rope(
        *ops.gain_inputs(x, gain), 1e-6, weight, bias, cos, sin, keys, values, torch.tensor([9], device=DEVICE), q_heads
    )
    q, k, v = F.linear(rms_norm(x, gain, 1e-6), weight, bias).split([q_heads * 64, kv_heads * 64, kv_heads * 64], -1)
    q, k, v = q.view(rows, -1, 64), k.view(rows, -1, 64), v.view(rows, -1, 64)
    q = q * cos[:, None] + rotate_half(q) * sin[:, None]
    k = k * cos[:, None] + rotate_half(k) * sin[:, None]
    for ours, expected in ((query, q), (keys[:, :, 9], k), (values[:, :, 9], v)):
        torch.testing.assert_close(ours, expected, atol=1e-1, rtol=2e-2)
        assert (ours - expected).float().abs().mean() < 1e-2
