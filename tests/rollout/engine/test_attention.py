"""Grouped-query SDPA attention: equal to transformers' SDPA with repeated KV heads, in a model and the engine;
each way of computing a decode step (``decode_attention``) too."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from torch import nn
from transformers import AttentionInterface, AutoModelForCausalLM, GenerationConfig
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from grpo_lightning.rollout.engine import attention
from grpo_lightning.rollout.engine.attention import (
    DECODE_ATTENTION_KINDS,
    GQA_ATTENTION,
    decode_attention,
    gqa_sdpa_attention_forward,
    grouped_query_attention,
    resolve_decode_kind,
)
from grpo_lightning.rollout.engine import StaticCacheGenerator
from grpo_lightning.rollout.types import SamplingParams
from grpo_lightning.quickstart.tiny import build_char_tokenizer, save_tiny_model, tiny_config

PROMPTS = ["1+2=", "37+45=", "(1)", "<think>3*4=12"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ------------------------------------------------------------------------------ the function


class Layer(nn.Module):
    """What the attention functions read from an attention layer."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def allowed_keys(batch: int, q_len: int, kv_len: int, offset: int, padding: list[int]) -> torch.Tensor:
    """Boolean ``[B, 1, S, L]``: query ``s`` sits at cache slot ``offset + s`` and sees the slots up to
    it, except the ``padding[b]`` left-padding slots of row ``b``; a padding query sees itself only."""
    slots = torch.arange(kv_len)
    positions = offset + torch.arange(q_len)
    causal = slots[None, :] <= positions[:, None]  # [S, L]
    valid = slots[None, :] >= torch.tensor(padding)[:, None]  # [B, L]
    allowed = causal[None] & valid[:, None]
    padded_query = positions[None, :] < torch.tensor(padding)[:, None]  # [B, S]
    allowed |= padded_query[..., None] & (slots[None, None, :] == positions[None, :, None])
    return allowed.unsqueeze(1)


def additive(allowed: torch.Tensor) -> torch.Tensor:
    """The float mask of eager attention: 0 where allowed, fp32's lowest value elsewhere."""
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)


def reference(query, key, value, allowed, scale):
    """Softmax attention over keys and values repeated to every query head, in float64."""
    groups = query.size(1) // key.size(1)
    key, value = repeat_kv(key, groups).double(), repeat_kv(value, groups).double()
    scores = query.double() @ key.transpose(-1, -2) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ value).transpose(1, 2).float()


@pytest.mark.parametrize("q_heads, kv_heads", [(14, 2), (7, 1), (4, 4)])
@pytest.mark.parametrize("q_len, offset", [(1, 8), (6, 0), (3, 4)])  # decode, prefill on a longer cache, chunk
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_matches_sdpa_with_repeated_kv(q_heads, kv_heads, q_len, offset, mask_kind):
    torch.manual_seed(0)
    batch, kv_len, dim = 3, 9, 4
    # query as the layers hand it over: a transposed view of [B, S, Hq, D]
    query = torch.randn(batch, q_len, q_heads, dim).transpose(1, 2)
    key, value = torch.randn(batch, kv_heads, kv_len, dim), torch.randn(batch, kv_heads, kv_len, dim)
    allowed = allowed_keys(batch, q_len, kv_len, offset, padding=[0, 3, 5])
    mask = allowed if mask_kind == "bool" else additive(allowed)
    layer = Layer(q_heads // kv_heads)

    out, weights = gqa_sdpa_attention_forward(layer, query, key, value, mask, scaling=0.7)
    assert weights is None and out.shape == (batch, q_len, q_heads, dim) and out.is_contiguous()
    expected, _ = sdpa_attention_forward(layer, query, key, value, mask, scaling=0.7)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out, reference(query, key, value, allowed, 0.7), atol=1e-6, rtol=1e-5)
    # scaling=None is 1 / sqrt(head_dim)
    out, _ = gqa_sdpa_attention_forward(layer, query, key, value, mask)
    torch.testing.assert_close(out, reference(query, key, value, allowed, 1 / math.sqrt(dim)), atol=1e-6, rtol=1e-5)


def test_hand_checked_decode_step():
    """Two query heads on one KV head, one query, two keys of which the second is masked for row 1."""
    query = torch.tensor([[[[1.0, 0.0]], [[0.0, 1.0]]]])  # [1, 2, 1, 2]
    key = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])  # [1, 1, 2, 2]
    value = torch.tensor([[[[10.0, 0.0], [0.0, 20.0]]]])
    query, key, value = query.expand(2, -1, -1, -1), key.expand(2, -1, -1, -1), value.expand(2, -1, -1, -1)
    mask = torch.tensor([[True, True], [True, False]]).view(2, 1, 1, 2)
    out, _ = gqa_sdpa_attention_forward(Layer(2), query, key, value, mask, scaling=math.log(3.0))
    # Row 0: head 0 scores (log 3, 0) -> weights (3/4, 1/4); head 1 scores (0, log 3) -> (1/4, 3/4).
    # Row 1: only the first key.
    expected = torch.tensor([[[[7.5, 5.0], [2.5, 15.0]]], [[[10.0, 0.0], [10.0, 0.0]]]])
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("q_len", [1, 5])
def test_without_mask_is_causal_like_sdpa(q_len):
    torch.manual_seed(0)
    query, key, value = torch.randn(2, 6, q_len, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    layer = Layer(3)
    out, _ = gqa_sdpa_attention_forward(layer, query, key, value, None)
    expected, _ = sdpa_attention_forward(layer, query, key, value, None)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    causal = torch.ones(q_len, 5, dtype=torch.bool).tril() if q_len > 1 else None
    torch.testing.assert_close(out, reference(query, key, value, causal, 1 / math.sqrt(8)), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", DECODE_ATTENTION_KINDS)
def test_float_mask_in_another_dtype(kind):
    """An fp32 additive mask with bf16 queries (the engine's mask for an eager model in bf16)."""
    torch.manual_seed(0)
    query = torch.randn(2, 4, 1, 8, dtype=torch.bfloat16)
    key, value = (torch.randn(2, 2, 7, 8, dtype=torch.bfloat16) for _ in range(2))
    allowed = allowed_keys(2, 1, 7, 6, padding=[0, 6])  # row 1 sees one key only
    with decode_attention(kind):
        out, _ = gqa_sdpa_attention_forward(Layer(2), query, key, value, additive(allowed))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    torch.testing.assert_close(out[1], value[1, :, 6].repeat_interleave(2, 0).unsqueeze(0))
    expected = reference(query, key, value, allowed, 1 / math.sqrt(8))
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


# ------------------------------------------------------------------- ways of computing a decode step


def decode_inputs(q_heads=14, kv_heads=2, batch=3, kv_len=9, dim=8, seed=0):
    """One query per row over a cache of ``kv_len`` slots; rows left-padded by 0, 3 and 5 slots."""
    torch.manual_seed(seed)
    query = torch.randn(batch, 1, q_heads, dim).transpose(1, 2)
    key, value = torch.randn(batch, kv_heads, kv_len, dim), torch.randn(batch, kv_heads, kv_len, dim)
    return query, key, value, allowed_keys(batch, 1, kv_len, kv_len - 1, padding=[0, 3, 5][:batch])


@pytest.mark.parametrize("kind", DECODE_ATTENTION_KINDS)
@pytest.mark.parametrize("q_heads, kv_heads", [(14, 2), (7, 1), (4, 4)])
@pytest.mark.parametrize("mask_kind", ["bool", "float", "per-head bool", None])
def test_decode_kinds_match_sdpa_with_repeated_kv(kind, q_heads, kv_heads, mask_kind):
    query, key, value, allowed = decode_inputs(q_heads, kv_heads)
    if mask_kind == "per-head bool":  # [B, Hq, 1, L]: a different row of padding for each query head
        allowed = allowed.repeat(1, q_heads, 1, 1)
        allowed[:, ::2, :, :2] = False
    mask = {"float": additive(allowed), None: None}.get(mask_kind, allowed)
    layer = Layer(q_heads // kv_heads)
    with decode_attention(kind):
        out, weights = gqa_sdpa_attention_forward(layer, query, key, value, mask, scaling=0.7)
    assert weights is None and out.shape == (3, 1, q_heads, 8) and out.is_contiguous()
    expected, _ = sdpa_attention_forward(layer, query, key, value, mask, scaling=0.7)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    allowed = None if mask is None else allowed
    torch.testing.assert_close(out, reference(query, key, value, allowed, 0.7), atol=1e-6, rtol=1e-5)
    with decode_attention(kind):  # scaling=None is 1 / sqrt(head_dim)
        out, _ = gqa_sdpa_attention_forward(layer, query, key, value, mask)
    torch.testing.assert_close(out, reference(query, key, value, allowed, 1 / math.sqrt(8)), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("mask_kind", ["bool", "-inf", "lowest"])
def test_math_decode_of_a_row_with_no_key_is_what_sdpa_gives(mask_kind):
    """A row that may attend to nothing: zeros with a boolean or a -inf mask (no NaN), the mean of the
    values with fp32's lowest value (every score equally low), as SDPA gives."""
    query, key, value, allowed = decode_inputs()
    allowed[1] = False
    fill = {"bool": None, "-inf": float("-inf"), "lowest": torch.finfo(torch.float32).min}[mask_kind]
    mask = allowed if fill is None else torch.zeros(allowed.shape).masked_fill(~allowed, fill)
    with decode_attention("math"):
        out, _ = gqa_sdpa_attention_forward(Layer(7), query, key, value, mask)
    expected, _ = sdpa_attention_forward(Layer(7), query, key, value, mask)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    assert torch.isfinite(out).all()
    if mask_kind == "lowest":
        torch.testing.assert_close(out[1], value[1].mean(1).repeat_interleave(7, 0).unsqueeze(0))
    else:
        assert (out[1] == 0).all()


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_compiled_math_decode_equals_eager(mask_kind):
    query, key, value, allowed = decode_inputs(kv_len=24)
    mask = allowed if mask_kind == "bool" else additive(allowed)

    def step(query, key, value, mask):
        return gqa_sdpa_attention_forward(Layer(7), query, key, value, mask)[0]

    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    with decode_attention("math"):
        eager, got = step(query, key, value, mask), compiled(query, key, value, mask)
    torch.testing.assert_close(got, eager, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got, reference(query, key, value, allowed, 1 / math.sqrt(8)), atol=1e-6, rtol=1e-5)


def test_math_decode_runs_the_written_out_softmax_and_only_for_one_query(monkeypatch):
    calls = []
    softmax_attention = attention._softmax_attention
    monkeypatch.setattr(attention, "_softmax_attention", lambda *a: calls.append(1) or softmax_attention(*a))
    query, key, value, allowed = decode_inputs()
    with decode_attention("math"):
        gqa_sdpa_attention_forward(Layer(7), query, key, value, allowed)
        assert len(calls) == 1
        prefill = torch.randn(3, 14, 4, 8)
        gqa_sdpa_attention_forward(Layer(7), prefill, key, value, allowed_keys(3, 4, 9, 5, padding=[0, 3, 5]))
        assert len(calls) == 1  # several queries: SDPA


def test_efficient_decode_restricts_sdpa_to_the_memory_efficient_kernel(monkeypatch):
    """On CUDA, ``"efficient"`` allows SDPA its memory-efficient kernel only, eager and compiled. A CPU
    has no such kernel: let the restriction apply on the CPU and see SDPA find no kernel to run."""
    query, key, value, allowed = decode_inputs()

    def step(query, key, value, mask):
        return gqa_sdpa_attention_forward(Layer(7), query, key, value, mask)[0]

    monkeypatch.setattr(attention, "_EFFICIENT_DEVICES", ("cpu",))
    with decode_attention("efficient"):
        for function in (step, torch.compile(step, fullgraph=True, dynamic=False)):
            with pytest.raises(RuntimeError, match="No viable backend"):
                function(query, key, value, allowed)
        prefill = torch.randn(3, 14, 4, 8)  # several queries: PyTorch's dispatch
        gqa_sdpa_attention_forward(Layer(7), prefill, key, value, allowed_keys(3, 4, 9, 5, padding=[0, 3, 5]))


def test_auto_decode_attention_is_math_on_a_cpu(monkeypatch):
    """``"auto"`` computes a CPU decode step with the written-out softmax (faster once compiled than
    PyTorch's CPU flash kernel); several queries still take PyTorch's dispatch."""
    written_out = []
    original = attention._softmax_attention
    monkeypatch.setattr(attention, "_softmax_attention", lambda *args: written_out.append(1) or original(*args))
    query, key, value, allowed = decode_inputs()
    with decode_attention("auto"):
        out, _ = gqa_sdpa_attention_forward(Layer(7), query, key, value, allowed, scaling=0.7)
        assert written_out == [1]
        gqa_sdpa_attention_forward(Layer(7), torch.randn(3, 14, 4, 8), key, value, allowed_keys(3, 4, 9, 5, padding=[0, 3, 5]))
        assert written_out == [1]
    torch.testing.assert_close(out, reference(query, key, value, allowed, 0.7), atol=1e-6, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("triton") is None, reason="needs CUDA and Triton")
def test_auto_decode_attention_is_the_triton_kernel_on_cuda(monkeypatch):
    """On CUDA with Triton installed, ``"auto"`` computes a decode step with the Triton kernel."""
    query, key, value, allowed = (t.cuda() for t in decode_inputs())
    with decode_attention("auto"):
        kernel, calls = attention._triton_kernel, []
        monkeypatch.setattr(attention, "_triton_kernel", lambda *args: calls.append(1) or kernel(*args))
        out, _ = gqa_sdpa_attention_forward(Layer(7), query, key, value, allowed, scaling=0.7)
    assert calls == [1]
    expected = reference(query.cpu(), key.cpu(), value.cpu(), allowed.cpu(), 0.7)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-4)


def test_decode_attention_is_scoped_and_validated():
    assert attention._decode_kind == "auto"
    with decode_attention("math"):
        with decode_attention("efficient"):
            assert attention._decode_kind == "efficient"
        assert attention._decode_kind == "math"
        with pytest.raises(RuntimeError, match="inside"), decode_attention("sdpa"):
            raise RuntimeError("inside")
        assert attention._decode_kind == "math"
    assert attention._decode_kind == "auto"
    allowed = "'auto', 'sdpa', 'efficient', 'math', 'triton'"
    with (
        pytest.raises(ValueError, match=f"decode_attention must be one of {allowed}, got 'flash'"),
        decode_attention("flash"),
    ):
        pass


# -------------------------------------------------------------------------------- in a model


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model_dir(tokenizer, tmp_path_factory):
    config = tiny_config(
        tokenizer,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        initializer_range=0.5,
    )
    return save_tiny_model(tmp_path_factory.mktemp("tiny_qwen2_gqa"), tokenizer, config, seed=0)


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request, model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=request.param).eval()
    assert model.config._attn_implementation == request.param
    return model


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls of the registered grouped-query function."""
    counter = {"n": 0}

    def counted(*args, **kwargs):
        counter["n"] += 1
        return gqa_sdpa_attention_forward(*args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, GQA_ATTENTION, counted)
    return counter


def attention_implementations(model) -> set:
    return {m.config._attn_implementation for m in model.modules() if hasattr(m, "config")}


def test_model_logits_unchanged_and_implementation_restored(model, tokenizer, calls):
    original = model.config._attn_implementation
    encoded = tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    assert (encoded["attention_mask"] == 0).any()  # left padding: a 2-D mask the model turns into 4-D
    with torch.no_grad():
        expected = model(**encoded).logits
        unpadded = model(input_ids=encoded["input_ids"][1:2]).logits  # no mask: causal through is_causal
        with grouped_query_attention(model) as switched:
            assert switched and attention_implementations(model) == {GQA_ATTENTION}
            got = model(**encoded).logits
            got_unpadded = model(input_ids=encoded["input_ids"][1:2]).logits
    assert calls["n"] == 2 * model.config.num_hidden_layers
    assert attention_implementations(model) == {original}
    valid = encoded["attention_mask"].bool()
    torch.testing.assert_close(got[valid], expected[valid], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_unpadded, unpadded, atol=1e-5, rtol=1e-5)
    # The padding reached the attention: dropping the mask would change the padded rows' logits.
    assert not torch.allclose(model(input_ids=encoded["input_ids"]).logits[valid], expected[valid], atol=1e-3)


def test_restored_after_an_exception(model):
    original = model.config._attn_implementation
    with pytest.raises(RuntimeError, match="inside"):
        with grouped_query_attention(model):
            raise RuntimeError("inside")
    assert attention_implementations(model) == {original}


def test_other_implementations_left_alone(model):
    original = model.config._attn_implementation
    model.config._attn_implementation_internal = "flash_attention_2"
    try:
        with grouped_query_attention(model) as switched:
            assert not switched and attention_implementations(model) == {"flash_attention_2"}
    finally:
        model.config._attn_implementation_internal = original


@pytest.mark.parametrize("kind", DECODE_ATTENTION_KINDS)
def test_engine_runs_grouped_attention(model, tokenizer, calls, kind):
    """Greedy completions of the static-cache engine (4-D masks, boolean for sdpa, float for eager),
    whichever way it computes the decode step, equal ``model.generate`` with the model's own
    attention, which is restored afterwards."""
    original = model.config._attn_implementation
    encoded = tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    eos = len(tokenizer) - 1  # a token the greedy completions below never produce: all rows run 8 steps
    config = GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    reference = model.generate(**encoded, generation_config=config)[:, encoded["input_ids"].size(1) :]
    assert reference.shape == (len(PROMPTS), 8) and not (reference == eos).any()
    assert calls["n"] == 0
    generator = StaticCacheGenerator(model, len(PROMPTS), 32, decode_attention=kind)
    sampling = SamplingParams(8, temperature=0.0)
    out = generator.generate(encoded["input_ids"], encoded["attention_mask"], sampling, eos, tokenizer.pad_token_id)
    assert torch.equal(out, reference)
    assert calls["n"] == 8 * model.config.num_hidden_layers  # the prefill and 7 decode steps
    assert attention_implementations(model) == {original} and attention._decode_kind == "auto"


def test_resolve_decode_kind_picks_the_way_a_single_query_is_computed():
    cpu, cuda, other = torch.device("cpu"), torch.device("cuda"), torch.device("mps")
    assert resolve_decode_kind("auto", cpu, True) == "math"  # the interpreter's kernel is not the CPU default
    assert resolve_decode_kind("auto", cuda, True) == "triton"
    assert resolve_decode_kind("auto", cuda, False) == "sdpa"
    assert resolve_decode_kind("auto", other, False) == "sdpa"
    assert resolve_decode_kind("triton", cpu, True) == "triton"
    assert resolve_decode_kind("triton", cuda, False) == "math"
    for kind in ("sdpa", "efficient", "math"):
        assert resolve_decode_kind(kind, cuda, True) == kind


def test_only_a_kind_that_can_run_the_kernel_imports_it_to_read_the_slots_in_use(monkeypatch):
    """Importing the kernel's module imports Triton (~1 s of a new process's first rollout): a decode
    kind that never runs it reads the whole cache without that import."""
    from grpo_lightning.rollout.engine import kernel_choice

    imported = []
    monkeypatch.setattr(kernel_choice, "importable", lambda module: imported.append(module) or True)
    cuda = torch.device("cuda")
    assert not any(kernel_choice.reads_slots_in_use(True, kind, cuda) for kind in ("sdpa", "efficient", "math"))
    assert not kernel_choice.reads_slots_in_use(False, "triton", cuda) and imported == []
    assert kernel_choice.reads_slots_in_use(True, "auto", cuda) and kernel_choice.reads_slots_in_use(True, "triton", cuda)
    assert len(imported) == 2
