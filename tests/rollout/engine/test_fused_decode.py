"""Decoding with fused q/k/v and gate/up products (``grpo_lightning.rollout.engine.fused_decode``): the same tokens as
the model's own forward pass, with parameters that stay the model's, in place."""

from __future__ import annotations

import importlib.util
import os
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_lightning.rollout.engine import StaticCacheGenerator
from grpo_lightning.rollout.engine.fused_decode import fuse_projections, qkv_kernel_applies, residual_plus_parts
from grpo_lightning.rollout.types import SamplingParams
from grpo_lightning.quickstart.tiny import build_char_tokenizer, save_tiny_model, tiny_config

PROMPTS = ["1+2=", "37+45=", "(1)", "<think>3*4=12"]
MAX_NEW = 12

pytestmark = pytest.mark.usefixtures("one_torch_thread")

KINDS = {
    "qwen2": {"model_type": "qwen2"},  # q/k/v biases
    "llama": {"model_type": "llama"},  # no biases
    "llama-biases": {"model_type": "llama", "attention_bias": True, "mlp_bias": True},
    "qwen3": {"model_type": "qwen3", "head_dim": 8},  # per-head q/k norms
    # Heads of 32, which the q/k/v kernel takes (grpo_lightning.rollout.engine.kernels.qkv)
    "qwen2-heads-of-32": {"model_type": "qwen2", "head_dim": 32},
    "llama-biases-heads-of-32": {"model_type": "llama", "attention_bias": True, "mlp_bias": True, "head_dim": 32},
}
KERNEL_RUNS = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module", params=list(KINDS))
def checkpoint(request, tokenizer, tmp_path_factory):
    config = tiny_config(
        tokenizer, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
        max_position_embeddings=64, initializer_range=1.0, **KINDS[request.param],
    )  # fmt: skip
    return save_tiny_model(tmp_path_factory.mktemp(request.param), tokenizer, config, seed=0)


def load(path):
    return AutoModelForCausalLM.from_pretrained(path).eval()


def encode(tokenizer, prompts):
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    return encoded["input_ids"], encoded["attention_mask"]


def rollout(generator, tokenizer, temperature=0.0, keys=None):
    ids, mask = encode(tokenizer, PROMPTS)
    sampling = SamplingParams(MAX_NEW, temperature=temperature)
    eos = len(tokenizer) - 1  # never sampled by these models: every row runs MAX_NEW steps
    return generator.generate(ids, mask, sampling, eos, tokenizer.pad_token_id, keys, return_logprobs=True)


@pytest.mark.parametrize("decode_attention", ["auto", "triton"])
def test_fused_decoding_samples_what_the_model_s_forward_samples(checkpoint, tokenizer, decode_attention):
    """``"triton"``: the Triton kernel on CUDA and under Triton's interpreter (see
    ``test_decode_kernel.py``), ``"math"`` elsewhere. There the q/k/v kernel runs too, for the kinds
    with heads of 32; its norm scales the product rather than its input: fp32 rounding, to 1e-4 of
    these log-probs."""
    plain, fused = load(checkpoint), load(checkpoint)
    reference = StaticCacheGenerator(plain, len(PROMPTS), 32)
    generator = StaticCacheGenerator(fused, len(PROMPTS), 32, fuse_projections=True, decode_attention=decode_attention)
    greedy, greedy_logprobs = rollout(generator, tokenizer)
    expected, expected_logprobs = rollout(reference, tokenizer)
    assert generator._decoder is not None
    # The q/k/v kernel's default: on wherever it runs (these models are on the CPU), for the models it takes.
    applies = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
    applies = applies and qkv_kernel_applies(fused, generator._fused)
    assert generator._decoder.qkv_kernel == applies
    tolerance = 1e-4 if applies else 1e-5
    assert len(set(expected.flatten().tolist())) > 4, "degenerate model: completions repeat a token"
    assert torch.equal(greedy, expected)
    torch.testing.assert_close(greedy_logprobs, expected_logprobs, atol=tolerance, rtol=tolerance)
    keys = torch.arange(len(PROMPTS)) + 11
    sampled, sampled_logprobs = rollout(generator, tokenizer, 1.0, keys)
    expected, expected_logprobs = rollout(reference, tokenizer, 1.0, keys)
    assert torch.equal(sampled, expected)
    torch.testing.assert_close(sampled_logprobs, expected_logprobs, atol=tolerance, rtol=tolerance)


def test_parameters_become_rows_of_one_buffer_and_save_as_before(checkpoint, tmp_path):
    model = load(checkpoint)
    before = {name: (id(p), p.detach().clone(), p.requires_grad) for name, p in model.named_parameters()}
    fused = fuse_projections(model)
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    for name, parameter in after.items():
        identity, value, requires_grad = before[name]
        assert id(parameter) == identity and parameter.requires_grad == requires_grad
        assert torch.equal(parameter, value)
    for layer in fused:
        attention = layer.layer.self_attn
        q, k, v = attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight
        assert q.untyped_storage().data_ptr() == v.untyped_storage().data_ptr() == layer.qkv.weight.data_ptr()
        assert k.data_ptr() == layer.qkv.weight[q.shape[0]].data_ptr()
        assert torch.equal(layer.qkv.weight, torch.cat([q, k, v]))
        mlp = layer.layer.mlp
        assert torch.equal(layer.gate_up.weight, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    assert fuse_projections(model, fused) is fused  # still in place: nothing to do
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    for name, parameter in reloaded.named_parameters():
        assert torch.equal(parameter, before[name][1]), name


def test_optimizer_steps_reach_the_next_rollout(checkpoint, tokenizer):
    """The optimizer updates the parameters in place, so in the shared buffer: the next rollout of the
    fused generator equals that of an unfused model given the same updated weights."""
    model = load(checkpoint)
    generator = StaticCacheGenerator(model, len(PROMPTS), 32, fuse_projections=True)
    first, _ = rollout(generator, tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    for parameter in model.parameters():
        parameter.grad = torch.randn_like(parameter)
    optimizer.step()
    layer = generator._fused[0]
    assert torch.equal(layer.qkv.weight[: layer.qkv.sizes[0]], layer.layer.self_attn.q_proj.weight)
    updated = load(checkpoint)
    updated.load_state_dict(model.state_dict())
    expected, _ = rollout(StaticCacheGenerator(updated, len(PROMPTS), 32), tokenizer)
    second, _ = rollout(generator, tokenizer)
    assert not torch.equal(second, first) and torch.equal(second, expected)


def test_replaced_parameters_are_fused_again(checkpoint, tokenizer):
    model = load(checkpoint)
    generator = StaticCacheGenerator(model, len(PROMPTS), 32, fuse_projections=True)
    rollout(generator, tokenizer)
    old = generator._fused
    state = {name: tensor.clone() * 0.5 for name, tensor in model.state_dict().items()}
    model.load_state_dict(state, assign=True)  # new tensors: no longer rows of the old buffers
    assert not old[0].qkv.holds_its_parameters()
    out, _ = rollout(generator, tokenizer)
    assert generator._fused is not old and generator._fused[0].qkv.holds_its_parameters()
    halved = load(checkpoint)
    halved.load_state_dict(state)
    assert torch.equal(out, rollout(StaticCacheGenerator(halved, len(PROMPTS), 32), tokenizer)[0])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))])
def test_compiled_fused_step_gives_the_eager_tokens(tokenizer, tmp_path, device):
    """Compiled (and on CUDA captured in a CUDA graph, with the Triton attention kernel), against the
    model's own forward pass run eagerly."""
    config = tiny_config(tokenizer, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                         initializer_range=1.0)  # fmt: skip
    path = save_tiny_model(tmp_path, tokenizer, config, seed=0)
    attention = "triton" if device == "cuda" else "math"
    compiled = StaticCacheGenerator(
        load(path).to(device), len(PROMPTS), 32, compile=True, fuse_projections=True, decode_attention=attention
    )
    eager = StaticCacheGenerator(load(path).to(device), len(PROMPTS), 32, use_cuda_graph=False)
    assert torch.equal(rollout(compiled, tokenizer)[0], rollout(eager, tokenizer)[0])
    assert compiled._decoder is not None


def test_one_compiled_layer_step_serves_every_layer(tokenizer, tmp_path, monkeypatch):
    """Regional compilation: the decode step and the prefill each trace one decoder layer once and
    run it for all four layers (a graph per layer would mean compile time growing with depth).
    Dynamo's eager backend stands in for Inductor: which graphs are traced is Dynamo's business."""
    config = tiny_config(tokenizer, hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=64,
                         initializer_range=1.0)  # fmt: skip
    path = save_tiny_model(tmp_path, tokenizer, config, seed=0)
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda function, **kwargs: compile_(function, backend="eager", dynamic=kwargs.get("dynamic")))
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    regional = StaticCacheGenerator(
        load(path), len(PROMPTS), 32, compile=True, compile_prefill=True, fuse_projections=True, use_cuda_graph=False
    )
    eager = StaticCacheGenerator(load(path), len(PROMPTS), 32, use_cuda_graph=False)
    keys = torch.arange(len(PROMPTS)) + 5
    for _ in range(2):  # the first prefill allocates the cache eagerly, the second is compiled
        tokens, logprobs = rollout(regional, tokenizer, temperature=1.0, keys=keys)
        expected_tokens, expected_logprobs = rollout(eager, tokenizer, temperature=1.0, keys=keys)
        assert torch.equal(tokens, expected_tokens)
        torch.testing.assert_close(logprobs, expected_logprobs)
    assert regional._compile_candidates[0][0] == "the decode step's layers"
    assert counters["stats"]["unique_graphs"] == 2  # the decode layer and the prefill layer


def test_other_models_decode_through_their_own_forward(tokenizer, tmp_path):
    config = tiny_config(tokenizer, model_type="olmo2", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                         intermediate_size=64, initializer_range=1.0)  # fmt: skip
    path = save_tiny_model(tmp_path, tokenizer, config, seed=0)
    model = load(path)
    assert fuse_projections(model) is None  # norms after attention and MLP: not a layer the fused decoder computes
    generator = StaticCacheGenerator(model, len(PROMPTS), 32, fuse_projections=True)
    out, _ = rollout(generator, tokenizer)
    assert generator._decoder is None
    assert torch.equal(out, rollout(StaticCacheGenerator(load(path), len(PROMPTS), 32), tokenizer)[0])


# ------------------------------------------------------------------ the compiled prefill (compile_prefill)


def test_the_fused_prefill_samples_what_the_model_s_forward_samples(checkpoint, tokenizer, monkeypatch):
    """``FusedDecoder.prefill`` itself, run as written: ``torch.compile`` is replaced by a stand-in
    that counts its calls and returns the function (the test below compiles for real)."""
    calls = []

    def stand_in_compile(function, **kwargs):
        def run(*args, **kw):
            calls.append(function.__name__)
            return function(*args, **kw)

        return run

    monkeypatch.setattr(torch, "compile", stand_in_compile)
    reference = StaticCacheGenerator(load(checkpoint), len(PROMPTS), 32)
    fused = StaticCacheGenerator(load(checkpoint), len(PROMPTS), 32, fuse_projections=True, compile_prefill=True)
    tokens, logprobs = rollout(reference, tokenizer)
    for _ in range(2):  # the first prefill allocates the cache, eagerly; the second is the fused one
        fused_tokens, fused_logprobs = rollout(fused, tokenizer)
    assert calls == ["prefill_layer"] * load(checkpoint).config.num_hidden_layers  # one compiled layer, run for each
    assert torch.equal(fused_tokens, tokens)
    torch.testing.assert_close(fused_logprobs, logprobs, atol=1e-5, rtol=1e-5)


def test_the_compiled_prefill_gives_the_eager_tokens_as_prompt_shapes_change(tokenizer, tmp_path):
    config = tiny_config(tokenizer, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                         initializer_range=1.0)  # fmt: skip
    path = save_tiny_model(tmp_path, tokenizer, config, seed=0)
    compiled = StaticCacheGenerator(load(path), 8, 32, fuse_projections=True, compile_prefill=True)
    eager = StaticCacheGenerator(load(path), 8, 32)
    sampling, eos = SamplingParams(MAX_NEW, temperature=0.0), len(tokenizer) - 1
    # Two calls of one shape (the first allocates the cache), then other lengths and prompt counts.
    for prompts in (PROMPTS, PROMPTS, ["12+3=", "7", "99*9=", "x"], ["abcdefghij", "1", "22"]):
        ids, mask = encode(tokenizer, prompts)
        ids, mask = ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0)
        outs = [g.generate(ids, mask, sampling, eos, tokenizer.pad_token_id) for g in (compiled, eager)]
        assert torch.equal(*outs)
    assert compiled._compiled_prefills._compiled_layer is not None and not compiled._compiled_prefills.failed


def test_compile_prefill_needs_fused_projections(checkpoint):
    with pytest.raises(ValueError, match="compile_prefill=True .* set fuse_projections=True"):
        StaticCacheGenerator(load(checkpoint), len(PROMPTS), 32, compile_prefill=True)


def test_a_failing_prefill_compiler_falls_back_to_the_eager_prefill(checkpoint, tokenizer, monkeypatch):
    def failing_compile(function, **kwargs):
        def run(*args, **kw):
            raise RuntimeError(f"cannot compile {function.__name__}")

        return run

    monkeypatch.setattr(torch, "compile", failing_compile)
    fused = StaticCacheGenerator(load(checkpoint), len(PROMPTS), 32, fuse_projections=True, compile_prefill=True)
    first, _ = rollout(fused, tokenizer)
    with pytest.warns(UserWarning, match="torch.compile of the prefill failed"):
        second, _ = rollout(fused, tokenizer)
    assert fused._compiled_prefills.failed
    assert torch.equal(second, first)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # eager from then on, without a warning
        assert torch.equal(rollout(fused, tokenizer)[0], first)


# ------------------------------------------------------------------ the down product in parts (down_parts)


def test_residual_plus_parts_adds_the_slices_products_to_the_residual():
    """Small integers: every product and sum is exact in fp32, so the result is exact in bf16."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randint(-4, 5, (3, 1, 6), generator=generator).bfloat16()
    x = torch.randint(-3, 4, (3, 1, 8), generator=generator).bfloat16()
    weight = torch.randint(-2, 3, (6, 8), generator=generator).bfloat16()
    bias = torch.randint(-5, 6, (6,), generator=generator).bfloat16()
    expected = hidden.float() + x.float() @ weight.float().T + bias.float()
    for parts in (1, 2, 4, 8):
        assert torch.equal(residual_plus_parts(hidden, x, weight, bias, parts), expected.bfloat16())
    assert torch.equal(residual_plus_parts(hidden, x, weight, None, 2), (expected - bias.float()).bfloat16())
    # Slice s of the input meets columns s*K/S .. (s+1)*K/S - 1 of the weight: a zero slice drops them.
    first_half = x.clone()
    first_half[..., 4:] = 0
    assert torch.equal(
        residual_plus_parts(hidden, first_half, weight, None, 2),
        (hidden.float() + x[..., :4].float() @ weight[:, :4].float().T).bfloat16(),
    )


def bf16_generator(path, device, **options):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
    return StaticCacheGenerator(model, len(PROMPTS), 32, fuse_projections=True, **options)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))])
def test_decoding_with_the_down_product_in_parts_samples_what_one_product_samples(tokenizer, tmp_path, device):
    config = tiny_config(tokenizer, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                         initializer_range=1.0, mlp_bias=True, model_type="llama")  # fmt: skip
    path = save_tiny_model(tmp_path, tokenizer, config, seed=0)
    options = {"down_parts": 2} if device == "cpu" else {}  # on CUDA, None means 2 parts for bf16 weights
    whole, in_parts = bf16_generator(path, device, down_parts=1), bf16_generator(path, device, **options)
    tokens, logprobs = rollout(whole, tokenizer)
    parts_tokens, parts_logprobs = rollout(in_parts, tokenizer)
    assert whole._decoder.down_parts == 1 and in_parts._decoder.down_parts == 2
    assert torch.equal(parts_tokens, tokens)
    torch.testing.assert_close(parts_logprobs, logprobs, atol=0.05, rtol=0)  # bf16 sums rounded in other places


def test_down_parts_is_one_product_on_a_cpu_and_needs_half_weights(checkpoint, tokenizer):
    generator = StaticCacheGenerator(load(checkpoint), len(PROMPTS), 32, fuse_projections=True)
    rollout(generator, tokenizer)
    assert generator._decoder.down_parts == 1
    with pytest.raises(ValueError, match="down_parts=2 needs bf16 or fp16"):
        rollout(StaticCacheGenerator(load(checkpoint), len(PROMPTS), 32, fuse_projections=True, down_parts=2), tokenizer)
    with pytest.raises(ValueError, match="down_parts must be at least 1"):
        StaticCacheGenerator(load(checkpoint), len(PROMPTS), 32, fuse_projections=True, down_parts=0)
    with pytest.raises(ValueError, match="down_parts=2 .* set fuse_projections=True"):
        StaticCacheGenerator(load(checkpoint), len(PROMPTS), 32, down_parts=2)


# ------------------------------------------------------------------- the q/k/v kernel (qkv_kernel)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="on CUDA; the test above covers the interpreter")
def test_decoding_on_the_qkv_kernel_on_cuda_samples_what_the_model_s_forward_samples(checkpoint, tokenizer):
    pytest.importorskip("triton")
    plain, on_kernel = load(checkpoint).cuda(), load(checkpoint).cuda()
    if not qkv_kernel_applies(on_kernel, fuse_projections(on_kernel)):
        pytest.skip("the kernel takes Llama, Mistral and Qwen2 models with heads of 32 to 256")
    reference = StaticCacheGenerator(plain, len(PROMPTS), 32, decode_attention="triton")
    fused = StaticCacheGenerator(on_kernel, len(PROMPTS), 32, decode_attention="triton", fuse_projections=True, qkv_kernel=True)
    tokens, logprobs = rollout(reference, tokenizer)
    kernel_tokens, kernel_logprobs = rollout(fused, tokenizer)
    assert fused._decoder.qkv_kernel
    assert torch.equal(kernel_tokens, tokens)
    torch.testing.assert_close(kernel_logprobs, logprobs, atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def one_layer_checkpoint(tokenizer, tmp_path_factory):
    config = tiny_config(tokenizer, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=80)
    return save_tiny_model(tmp_path_factory.mktemp("one-layer"), tokenizer, config, seed=0)


@pytest.mark.skipif(KERNEL_RUNS, reason="where the kernel runs, None turns it on")
def test_qkv_kernel_none_keeps_the_modules_on_a_cpu_and_true_says_why_not(one_layer_checkpoint, tokenizer):
    path = one_layer_checkpoint
    generator = StaticCacheGenerator(load(path), len(PROMPTS), 32, fuse_projections=True)
    rollout(generator, tokenizer)
    assert generator._decoder is not None and not generator._decoder.qkv_kernel
    forced = StaticCacheGenerator(load(path), len(PROMPTS), 32, fuse_projections=True, qkv_kernel=True)
    with pytest.raises(ValueError, match="qkv_kernel=True needs a CUDA device"):
        rollout(forced, tokenizer)


def test_the_qkv_kernel_needs_fused_projections(one_layer_checkpoint):
    with pytest.raises(ValueError, match="set fuse_projections=True too"):
        StaticCacheGenerator(load(one_layer_checkpoint), 2, 32, qkv_kernel=True)


def test_qkv_kernel_true_names_a_model_without_a_fused_decode_step(tmp_path, tokenizer):
    config = tiny_config(
        tokenizer, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=80, model_type="gpt2"
    )
    model = load(save_tiny_model(tmp_path, tokenizer, config, seed=0))
    generator = StaticCacheGenerator(model, len(PROMPTS), 32, fuse_projections=True, qkv_kernel=True)
    with pytest.raises(ValueError, match="has no fused decode step"):
        rollout(generator, tokenizer)
