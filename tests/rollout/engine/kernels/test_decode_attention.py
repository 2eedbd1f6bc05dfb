"""The ``"triton"`` decode attention kernel (``grpo_lightning.rollout.engine.kernels.decode_attention``) against an fp64 softmax.

The kernel runs on CUDA. Without a GPU, Triton's interpreter runs it on the CPU, but only when
``TRITON_INTERPRET=1`` is set before Triton and ``grpo_lightning.rollout.engine.attention`` are imported: the test
``test_the_kernel_under_triton_s_interpreter`` runs this file's tests, and the ``"triton"`` cases
of the attention and engine tests, in a fresh process with that setting. Without Triton, all skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

RUNS_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernel = pytest.mark.skipif(not RUNS_HERE, reason="runs on CUDA or under TRITON_INTERPRET=1 (see below)")


@pytest.mark.slow
@pytest.mark.skipif(RUNS_HERE, reason="the kernel's tests run in this process")
@pytest.mark.parametrize(
    "files",
    [("test_fused_decode.py",),  # two halves of about 45 s each, which two test workers can run at once
     ("kernels/test_decode_attention.py", "test_attention.py", "test_generator.py", "kernels/test_qkv.py",
      "kernels/test_sampling.py")],
    ids=["fused_decode", "attention_generation_sampling"],
)  # fmt: skip
def test_the_kernel_under_triton_s_interpreter(files):
    engine_tests = Path(__file__).resolve().parents[1]
    selected = [str(engine_tests / name) for name in files]
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run(
        # The kernel sees the same attention call from every model family: interpreted, one family (qwen2)
        # is enough; on CUDA the llama cases run too.
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "(triton or kernel) and not llama", *selected],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and " failed" not in result.stdout


def reference(query, key, value, mask, scale):
    """fp64 ``softmax(scale * q k^T + mask) v``; a row with nothing to attend to gives zeros."""
    scores = (query.double() @ key.double().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.double()
    probs = torch.nan_to_num(scores.softmax(dim=-1), nan=0.0)
    return probs @ value.double()


def inputs(batch=3, kv_heads=2, group=7, kv_len=130, head_dim=16, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(DEVICE, dtype)

    # The query as the attention function gets it: [B, Hq, 1, D] transposed from [B, 1, Hq, D], then
    # stacked per group: a strided view, not a contiguous tensor.
    query = randn(batch, 1, kv_heads * group, head_dim).transpose(1, 2).reshape(batch, kv_heads, group, head_dim)
    # The cache's slots beyond kv_len exist but are not read: a view of a longer buffer.
    key = randn(batch, kv_heads, kv_len + 5, head_dim)[:, :, :kv_len]
    value = randn(batch, kv_heads, kv_len + 5, head_dim)[:, :, :kv_len]
    return query, key, value


def decode_attention(*args):
    from grpo_lightning.rollout.engine.kernels.decode_attention import decode_attention as kernel

    return kernel(*args)


@needs_kernel
@pytest.mark.parametrize(
    ("group", "kv_len", "head_dim"),
    [(7, 130, 16), (1, 1, 16), (8, 64, 64), (2, 65, 80), (16, 200, 32)],
)
@pytest.mark.parametrize("mask_kind", [None, "bool", "per-head bool", "additive", "cache in use"])
@pytest.mark.parametrize("splits", [0, 3])
def test_kernel_equals_the_fp64_softmax(group, kv_len, head_dim, mask_kind, splits):
    """``splits=3``: each row and KV head's cache in (up to) three parts, combined by a second kernel."""
    query, key, value = inputs(group=group, kv_len=kv_len, head_dim=head_dim)
    generator = torch.Generator().manual_seed(1)
    if mask_kind is None:
        mask = None
    elif mask_kind == "per-head bool":  # [B, Hkv, g, L]: each query head its own slots
        mask = (torch.rand(3, 2, group, kv_len, generator=generator) > 0.4).to(DEVICE)
    elif mask_kind == "cache in use":  # a decode step: left padding, then the slots written so far
        slots = torch.arange(kv_len)
        used = slots < max(1, kv_len // 3)
        mask = (used & (slots >= torch.tensor([0, kv_len // 5, kv_len // 3 - 1])[:, None])).to(DEVICE)[:, None, None]
    else:  # [B, 1, 1, L]: left padding of each row, as the engine passes it
        mask = (torch.arange(kv_len) >= torch.tensor([0, kv_len // 3, kv_len - 1])[:, None]).to(DEVICE)[:, None, None]
        if mask_kind == "additive":
            mask = torch.zeros(mask.shape, device=DEVICE).masked_fill(~mask, torch.finfo(torch.float32).min)
    out = decode_attention(query, key, value, mask, 0.37, splits)
    assert out.shape == query.shape and out.dtype == query.dtype and out.is_contiguous()
    expected = reference(query, key, value, mask, 0.37)
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("splits", [1, 2])
def test_a_row_with_nothing_to_attend_to_gives_zeros(splits):
    query, key, value = inputs()
    mask = torch.ones(3, 1, 1, 130, dtype=torch.bool, device=DEVICE)
    mask[1] = False
    mask[2, :, :, :70] = False  # with two splits, one part of this row has nothing to attend to
    out = decode_attention(query, key, value, mask, 0.25, splits)
    assert torch.isfinite(out).all() and (out[1] == 0).all()
    torch.testing.assert_close(out.double(), reference(query, key, value, mask, 0.25), atol=2e-6, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("splits", [0, 2])
@pytest.mark.parametrize(("limit", "bool_mask"), [(70, True), (128, True), (70, False)])
def test_slots_in_use_reads_no_slot_past_the_limit_and_changes_nothing_else(limit, bool_mask, splits):
    """A decode step's cache: each row's slots in use, the rest masked and holding NaN (not written
    yet, as far as the test knows). Reading a NaN slot would make the output NaN."""
    from grpo_lightning.rollout.engine.kernels.decode_attention import slots_in_use

    query, key, value = inputs(group=7, kv_len=200, head_dim=64)
    in_use = torch.tensor([70, 41, 1])  # slots in use per row, none past the limit
    allowed = (torch.arange(200) < in_use[:, None]).to(DEVICE)[:, None, None]
    mask = allowed if bool_mask else torch.zeros(allowed.shape, device=DEVICE).masked_fill(~allowed, float("-inf"))
    clean_out = decode_attention(query, key, value, mask, 0.125, splits)
    key, value = key.clone(), value.clone()
    key[:, :, limit:], value[:, :, limit:] = float("nan"), float("nan")
    with slots_in_use(limit):
        out = decode_attention(query, key, value, mask, 0.125, splits)
    if splits == 0:  # one part: bit for bit, as masked blocks add nothing to the online softmax
        assert torch.equal(out, clean_out)  # (with splits, the parts' bounds move with the limit)
    expected = reference(query, key.nan_to_num(), value.nan_to_num(), mask, 0.125)
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)
    assert torch.isnan(decode_attention(query, key, value, mask, 0.125, splits)).any()  # without the limit


def test_slots_in_use_rejects_an_empty_limit_and_restores_the_previous_one():
    pytest.importorskip("triton")
    from grpo_lightning.rollout.engine.kernels import decode_attention as decode_kernel

    with pytest.raises(ValueError, match="limit must be at least 1"):
        with decode_kernel.slots_in_use(0):
            pass
    with decode_kernel.slots_in_use(64):
        with decode_kernel.slots_in_use(None):
            assert decode_kernel._slot_limit is None
        assert decode_kernel._slot_limit == 64
    assert decode_kernel._slot_limit is None


@needs_kernel
@pytest.mark.parametrize(("block", "warps", "stages", "splits"), [(32, 2, 1, 1), (128, 8, 4, 2), (256, 4, 2, 0)])
def test_launch_settings_change_the_speed_not_the_result(block, warps, stages, splits):
    """The settings ``benchmarks/studies/decode_attention_configs.py`` compares: slots per loop step (more
    than the cache holds, too), warps, pipeline stages and splits."""
    from grpo_lightning.rollout.engine.kernels.decode_attention import launch_decode_attention

    query, key, value = inputs(group=7, kv_len=200, head_dim=64)
    mask = (torch.arange(200) < torch.tensor([150, 90, 1])[:, None]).to(DEVICE)[:, None, None]
    out = launch_decode_attention(query, key, value, mask, 0.125, splits, block, warps, stages)
    torch.testing.assert_close(out.double(), reference(query, key, value, mask, 0.125), atol=2e-6, rtol=1e-5)


@needs_kernel
def test_bf16_kernel_is_within_rounding_of_the_fp64_softmax():
    query, key, value = inputs(group=7, kv_len=200, head_dim=64, dtype=torch.bfloat16)
    mask = (torch.arange(200) >= torch.tensor([0, 50, 199])[:, None]).to(DEVICE)[:, None, None]
    out = decode_attention(query, key, value, mask, 0.125)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), reference(query, key, value, mask, 0.125), atol=2e-2, rtol=2e-2)


@needs_kernel
def test_compiled_code_calls_the_kernel_as_it_is():
    """``torch.compile`` (the engine compiles its decode step) keeps the operator whole, with the
    shapes of its fake implementation, between the kernels it generates around it."""
    query, key, value = inputs(group=7, kv_len=100)
    mask = (torch.arange(100) >= torch.tensor([0, 30, 99])[:, None]).to(DEVICE)[:, None, None]

    def step(query, key, value, mask):
        return decode_attention(query * 2.0, key, value, mask, 0.25).sum(dim=2) + 1.0

    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    torch.testing.assert_close(compiled(query, key, value, mask), step(query, key, value, mask), atol=1e-5, rtol=1e-5)


def test_cache_splits_give_the_multiprocessors_work_and_no_empty_part():
    from grpo_lightning.rollout.engine.kernels.decode_attention import cache_splits

    assert cache_splits(8, 2, 8192, torch.device("cpu")) == 1
    if torch.cuda.is_available():
        device = torch.device("cuda")
        processors = torch.cuda.get_device_properties(device).multi_processor_count
        assert cache_splits(8, 2, 8192, device) == -(-2 * processors // 16)
        assert cache_splits(8, 2, 100, device) == 2  # two blocks of slots
        assert cache_splits(processors, 1, 8192, device) == 1  # a pair per multiprocessor already
        assert cache_splits(4096, 2, 8192, device) == 1


@needs_kernel
def test_kernel_rejects_mismatched_shapes():
    query, key, value = inputs()
    with pytest.raises(ValueError, match="do not share batch, KV heads and length"):
        decode_attention(query, key[:, :1], value[:, :1], None, 1.0)
