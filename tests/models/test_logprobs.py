"""Per-token log-probs and entropy: values and gradients against the plain full-vocabulary formula."""

from __future__ import annotations

import pytest
import torch

from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from grpo_lightning.algorithms.functional import left_padding_last
from grpo_lightning.models import logprobs
from grpo_lightning.models.logprobs import (
    completion_logprobs,
    linear_token_logprobs,
    plain_lm_head,
    position_ids_from_mask,
    token_logprobs_from_logits,
)


def reference(logits, targets, temperature):
    logsm = torch.log_softmax(logits.double() / temperature, -1)
    logp = logsm.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logsm.exp() * logsm).sum(-1)
    return logp, entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_rows", [1, 2, 8])
def test_values_and_gradient_match_the_plain_log_softmax(temperature, chunk_rows):
    torch.manual_seed(0)
    logits = torch.randn(5, 4, 11, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (5, 4))
    weights = torch.randn(5, 4, dtype=torch.float64)

    logp, entropy = token_logprobs_from_logits(logits, targets, temperature, chunk_rows)
    (logp * weights).sum().backward()
    grad = logits.grad.clone()
    logits.grad = None
    expected_logp, expected_entropy = reference(logits, targets, temperature)
    (expected_logp * weights).sum().backward()

    torch.testing.assert_close(logp.double(), expected_logp, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(entropy.double(), expected_entropy.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, logits.grad, rtol=1e-6, atol=1e-6)
    assert not entropy.requires_grad


def test_without_entropy_the_log_probs_and_gradient_are_the_same():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 11, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (3, 4))
    full, _ = token_logprobs_from_logits(logits, targets, 0.7, 2)
    full.sum().backward()
    grad, logits.grad = logits.grad.clone(), None
    lean, entropy = token_logprobs_from_logits(logits, targets, 0.7, 2, with_entropy=False)
    lean.sum().backward()
    assert entropy is None
    torch.testing.assert_close(lean, full, rtol=0, atol=0)
    torch.testing.assert_close(logits.grad, grad, rtol=0, atol=0)


def test_low_precision_logits_are_reduced_in_fp32():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 50).bfloat16()
    targets = torch.randint(0, 50, (2, 3))
    logp, _ = token_logprobs_from_logits(logits, targets)
    assert logp.dtype == torch.float32
    expected, _ = reference(logits.float(), targets, 1.0)
    torch.testing.assert_close(logp.double(), expected, rtol=0, atol=1e-5)


def test_a_uniform_distribution_has_entropy_log_v():
    _, entropy = token_logprobs_from_logits(torch.zeros(1, 2, 8), torch.zeros(1, 2, dtype=torch.long))
    torch.testing.assert_close(entropy, torch.full((1, 2), torch.log(torch.tensor(8.0)).item()))


def test_positions_skip_left_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_left_padding_moves_to_the_end_of_each_row():
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0], [0, 1, 1, 1]])
    order, shift = left_padding_last(mask)
    assert shift.tolist() == [2, 0, 1]
    assert order.tolist() == [[2, 3, 0, 1], [0, 1, 2, 3], [1, 2, 3, 0]]
    assert mask.gather(1, order).tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]]
    assert left_padding_last(mask, most=1)[1].tolist() == [1, 0, 1]


@pytest.mark.parametrize("fused_head", [False, True])
def test_a_prompt_of_padding_only_gives_the_left_padded_batchs_log_probs(tiny_model_dir, fused_head):
    """A row whose prompt is all padding keeps its last prompt column (which predicts the first
    completion token) in front of the completion, as in the left-padded batch."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompt_ids, prompt_mask, completion_ids, completion_mask = ragged_batch(model.config.vocab_size)
    prompt_mask[0] = 0
    batch = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    logp, _ = completion_logprobs(model, *batch, 0.9, fused_head=fused_head)
    with torch.no_grad():
        expected = left_padded_layout_logprobs(model, *batch, 0.9)
    torch.testing.assert_close(logp.detach(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_kernels_give_the_eager_values_and_gradient():
    torch.manual_seed(0)
    logits = torch.randn(6, 5, 1000, device="cuda").bfloat16().requires_grad_()
    targets = torch.randint(0, 1000, (6, 5), device="cuda")
    weights = torch.randn(6, 5, device="cuda")
    results = []
    for compiled in (False, True):
        logp, entropy = token_logprobs_from_logits(logits, targets, 0.8, chunk_rows=2, compiled=compiled)
        (logp * weights).sum().backward()
        results.append((logp, entropy, logits.grad.float()))
        logits.grad = None
    for eager, fused in zip(*results):
        torch.testing.assert_close(fused, eager, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("chunk_tokens", [1, 4, 64])
def test_the_fused_head_gives_the_log_probs_and_gradients_of_the_head_then_log_softmax(chunk_tokens):
    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(13, 8, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 13, (3, 5))
    weights = torch.randn(3, 5, dtype=torch.float64)

    logp, entropy = linear_token_logprobs(hidden, weight, targets, 0.7, chunk_tokens)
    (logp * weights).sum().backward()
    fused_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    expected_logp, expected_entropy = reference(hidden @ weight.T, targets, 0.7)
    (expected_logp * weights).sum().backward()

    # The log-softmax is fp32 by design: logits of scale ~3 here leave about 1e-6 of rounding.
    torch.testing.assert_close(logp.double(), expected_logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy.double(), expected_entropy.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused_grads[0], hidden.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused_grads[1], weight.grad, rtol=1e-5, atol=1e-5)


def test_the_fused_heads_backward_in_aligned_vocabulary_blocks_gives_the_plain_gradient():
    """300 tokens, a 500-word vocabulary and 100-token chunks: the backward pass takes vocabulary
    blocks of 128 columns (166 rounded down to a multiple of 64), the last one 116 wide."""
    torch.manual_seed(0)
    hidden = torch.randn(300, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(500, 8, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 500, (300,))
    upstream = torch.randn(300, dtype=torch.float64)
    logp, _ = linear_token_logprobs(hidden, weight, targets, 1.0, chunk_tokens=100, with_entropy=False)
    (logp * upstream).sum().backward()
    fused_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    (torch.log_softmax(hidden @ weight.T, -1).gather(-1, targets[:, None])[:, 0] * upstream).sum().backward()
    torch.testing.assert_close(fused_grads[0], hidden.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused_grads[1], weight.grad, rtol=1e-5, atol=1e-5)


def test_the_fused_head_under_bf16_autocast_computes_and_backpropagates_in_bf16():
    """fp32 weights under autocast: the logits are bf16 in the forward and in the recomputation
    of the backward (which autocast does not cover), as in the unfused head."""
    torch.manual_seed(0)
    hidden = torch.randn(2, 3, 16, requires_grad=True)
    weight = torch.randn(40, 16, requires_grad=True)
    targets = torch.randint(0, 40, (2, 3))
    results = []
    for fused in (True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if fused:
                logp, _ = linear_token_logprobs(hidden, weight, targets, chunk_tokens=2)
            else:
                logp, _ = token_logprobs_from_logits(hidden @ weight.T, targets, chunk_rows=1)
        logp.sum().backward()
        results.append((logp, hidden.grad.clone(), weight.grad.clone()))
        assert hidden.grad.dtype == weight.grad.dtype == torch.float32
        hidden.grad = weight.grad = None
    for fused, plain in zip(*results):
        torch.testing.assert_close(fused, plain, rtol=2e-2, atol=2e-2)


def test_completion_log_probs_with_the_fused_head_match_the_models_own_logits(tiny_model_dir, monkeypatch):
    """Same values and gradients as the model's own logits; the fused head runs only at the
    completion tokens that count, and both paths give 0 after them."""
    headed_tokens = []

    def counting(hidden, *args, **kwargs):
        headed_tokens.append(hidden.shape[0])
        return linear_token_logprobs(hidden, *args, **kwargs)

    monkeypatch.setattr(logprobs, "linear_token_logprobs", counting)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert plain_lm_head(model) is model.get_output_embeddings()
    torch.manual_seed(0)
    vocab = model.config.vocab_size
    prompt_ids = torch.randint(0, vocab, (3, 6))
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6, [0, 1, 1, 1, 1, 1]])
    completion_ids = torch.randint(0, vocab, (3, 5))
    completion_mask = torch.tensor([[1, 1, 1, 0, 0], [1] * 5, [1, 1, 1, 1, 0]])
    weights = torch.randn(3, 5)
    results = []
    for fused in (True, False):
        logp, entropy = completion_logprobs(
            model, prompt_ids, prompt_mask, completion_ids, completion_mask, 0.9, fused_head=fused
        )
        (logp * weights).sum().backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        results.append((logp, entropy, grads))
    (fused_logp, fused_entropy, fused_grads), (logp, entropy, grads) = results
    assert headed_tokens == [int(completion_mask.sum())]
    padding = completion_mask == 0
    assert (logp[padding] == 0).all() and (entropy[padding] == 0).all()
    torch.testing.assert_close(fused_logp, logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused_entropy, entropy, rtol=1e-5, atol=1e-5)
    assert fused_grads.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(fused_grads[name], grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_models_with_other_heads_keep_the_unfused_path():
    """A head with a bias, or a model type not known to use its head's output as the logits
    as they are (GPT-2 here), is not fused."""
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20, n_positions=16))
    assert plain_lm_head(gpt2) is None
    assert plain_lm_head(torch.nn.Linear(3, 4)) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("compiled", [False, True])
def test_the_fused_head_in_bf16_on_cuda_matches_the_unfused_head(compiled):
    torch.manual_seed(0)
    hidden = torch.randn(4, 33, 256, device="cuda").bfloat16().requires_grad_()
    weight = (torch.randn(5000, 256, device="cuda") / 16).bfloat16().requires_grad_()
    targets = torch.randint(0, 5000, (4, 33), device="cuda")
    upstream = torch.randn(4, 33, device="cuda")
    results = []
    for fused in (True, False):
        if fused:
            logp, entropy = linear_token_logprobs(hidden, weight, targets, 0.8, chunk_tokens=50, compiled=compiled)
        else:
            logp, entropy = token_logprobs_from_logits(hidden @ weight.T, targets, 0.8, chunk_rows=1, compiled=compiled)
        (logp * upstream).sum().backward()
        results.append((logp, entropy, hidden.grad.float(), weight.grad.float()))
        hidden.grad = weight.grad = None
    for fused, plain in zip(*results):
        torch.testing.assert_close(fused, plain, rtol=2e-2, atol=2e-2)


def policy_and_frozen_copy(model_dir):
    """The model to train, and a frozen copy of it (as the reference model is)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model, AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).requires_grad_(False)


@pytest.fixture
def eager_compile_graphs(monkeypatch):
    """Dynamo's counters, cleared, with ``torch.compile`` on Dynamo's eager backend (which graphs are
    traced is Dynamo's business, so it stands in for Inductor) and a fresh compiled layer call."""
    from torch._dynamo.utils import counters

    from grpo_lightning.models import compiled_layers

    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda function, **kwargs: compile_(function, backend="eager", dynamic=kwargs.get("dynamic")))
    monkeypatch.setattr(logprobs, "_FORWARDS", logprobs._ModelForwards())
    compiled_layers._compiled_layer_call.cache_clear()
    torch._dynamo.reset()
    counters.clear()
    yield counters
    compiled_layers._compiled_layer_call.cache_clear()


def ragged_batch(vocab: int):
    """Left-padded prompts and completions of different lengths (padding after each EOS)."""
    torch.manual_seed(0)
    prompt_ids = torch.randint(0, vocab, (3, 6))
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6, [0, 1, 1, 1, 1, 1]])
    completion_ids = torch.randint(0, vocab, (3, 5))
    completion_mask = torch.tensor([[1, 1, 1, 0, 0], [1] * 5, [1, 0, 0, 0, 0]])
    return prompt_ids, prompt_mask, completion_ids, completion_mask


@pytest.mark.parametrize("fused_head", [False, True])
def test_packed_rows_give_the_padded_batchs_log_probs_and_gradients(tiny_model_dir, fused_head):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    batch = ragged_batch(model.config.vocab_size)
    seen_shapes = []
    model.model.register_forward_pre_hook(lambda module, args, kwargs: seen_shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    weights = torch.randn(3, 5)
    results = []
    for packed in (True, False):
        logp, entropy = completion_logprobs(model, *batch, 0.9, fused_head=fused_head, packed=packed)
        (logp * weights).sum().backward()
        results.append((logp, entropy, {name: p.grad.clone() for name, p in model.named_parameters()}))
        model.zero_grad(set_to_none=True)
    # One row of every real token: 4 + 6 + 5 prompt tokens and 3 + 5 + 1 completion tokens.
    assert seen_shapes == [(1, 24), (3, 11)]
    (packed_logp, packed_entropy, packed_grads), (logp, entropy, grads) = results
    torch.testing.assert_close(packed_logp, logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed_entropy, entropy, rtol=1e-5, atol=1e-5)
    for name in grads:
        torch.testing.assert_close(packed_grads[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)


def left_padded_layout_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature):
    """The log-probs by the textbook: the batch as it comes (left-padded), the model's full logits."""
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    mask = torch.cat([prompt_mask, completion_mask], 1)
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    logp = torch.log_softmax(logits[:, -completion_ids.size(1) - 1 : -1].float() / temperature, -1)
    return logp.gather(-1, completion_ids[..., None]).squeeze(-1) * completion_mask


@pytest.mark.parametrize("fused_head", [False, True])
def test_no_position_attends_to_nothing_and_the_log_probs_are_those_of_the_left_padded_batch(tiny_model_dir, fused_head):
    """Each row's left padding goes to its end before the model runs, so every position the model
    sees attends to its row's first token: a position that attended to no key made cuDNN's attention
    give NaN gradients on an H200. The log-probs and gradients are the left-padded batch's (CPU
    attention gives such positions zeros), though the completions now start at different columns."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    masks = []
    model.model.register_forward_pre_hook(lambda module, args, kwargs: masks.append(kwargs["attention_mask"]), with_kwargs=True)
    batch = ragged_batch(model.config.vocab_size)
    weights = torch.randn(3, 5)
    results = []
    for ours in (True, False):
        if ours:
            logp, _ = completion_logprobs(model, *batch, 0.9, fused_head=fused_head)
        else:
            logp = left_padded_layout_logprobs(model, *batch, 0.9)
        (logp * weights).sum().backward()
        results.append((logp, {name: p.grad.clone() for name, p in model.named_parameters()}))
        model.zero_grad(set_to_none=True)
    assert masks[0][:, 0].all() and not masks[1][:, 0].all()
    (logp, grads), (expected, expected_grads) = results
    torch.testing.assert_close(logp, expected, rtol=1e-5, atol=1e-5)
    for name in grads:
        torch.testing.assert_close(grads[name], expected_grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("compiled_model", [False, True])
def test_left_padded_batches_of_the_width_that_made_cudnn_attention_give_nan_gradients_train(compiled_model, monkeypatch):
    """On an H200 (torch 2.11), cuDNN's attention gave NaN gradients to a bf16 batch 64 columns wide
    whose left padding attended to nothing (pytorch/pytorch#196678: widths of 64 mod 128): eagerly,
    and compiled once the width was padded to 64. cuDNN is forced here, as the default backends
    chose it only in some processes. The batch left as it comes is the control: where this stack has
    the bug it gives NaN, and the printed line says so; the library's pass must give none."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=256)  # fmt: skip
    model = LlamaForCausalLM(config).cuda()
    prompt_ids, completion_ids = torch.randint(0, 512, (8, 20), device="cuda"), torch.randint(0, 512, (8, 44 - compiled_model), device="cuda")
    prompt_mask, completion_mask = torch.ones_like(prompt_ids), torch.ones_like(completion_ids)
    prompt_mask[0, :5] = prompt_mask[3, :2] = 0
    completion_mask[2, -7:] = 0

    def nonfinite_gradients():
        with torch.autocast("cuda", dtype=torch.bfloat16), sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            logp, _ = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, compiled_model=compiled_model)
        logp.sum().backward()
        assert torch.isfinite(logp).all()
        bad = [name for name, p in model.named_parameters() if not torch.isfinite(p.grad).all()]
        model.zero_grad(set_to_none=True)
        return bad

    with monkeypatch.context() as patch:  # the control: left padding kept first
        patch.setattr(logprobs, "left_padding_last", lambda mask, most=None: left_padding_last(mask, most=0))
        try:
            control = nonfinite_gradients()
        except RuntimeError as error:
            if "No available kernel" in str(error):
                pytest.skip(f"cuDNN attention cannot run here: {error}")
            raise
    print(f"cuDNN attention, left padding first: {len(control)} parameters with non-finite gradients")
    assert nonfinite_gradients() == []


def test_packing_refuses_a_completion_mask_with_holes(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompt_ids, prompt_mask, completion_ids, completion_mask = ragged_batch(model.config.vocab_size)
    completion_mask[1, 2] = 0
    with pytest.raises(ValueError, match="completion_mask"):
        completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, packed=True)


@pytest.mark.slow
def test_the_compiled_model_gives_the_eager_log_probs_and_gradients(tiny_model_dir):
    """``compiled_model``: the policy (with gradients) and a frozen copy (without) through
    ``torch.compile`` on the CPU, padded and packed, fused head or not, against the eager model."""
    torch._dynamo.reset()
    model, frozen = policy_and_frozen_copy(tiny_model_dir)
    batch = ragged_batch(model.config.vocab_size)
    weights = torch.randn(3, 5)
    for options in ({}, {"fused_head": True}, {"packed": True}):
        results = []
        for compiled in (True, False):
            with torch.no_grad():
                frozen_logp, _ = completion_logprobs(frozen, *batch, with_entropy=False, compiled_model=compiled, **options)
            logp, entropy = completion_logprobs(model, *batch, 0.9, compiled_model=compiled, **options)
            (logp * weights).sum().backward()
            results.append((frozen_logp, logp, entropy, {name: p.grad.clone() for name, p in model.named_parameters()}))
            model.zero_grad(set_to_none=True)
        (*compiled_values, compiled_grads), (*eager_values, eager_grads) = results
        for got, expected in zip(compiled_values, eager_values):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=str(options))
        for name in eager_grads:
            torch.testing.assert_close(compiled_grads[name], eager_grads[name], rtol=1e-4, atol=1e-6, msg=f"{options} {name}")
    assert not logprobs._FORWARDS.failed


def test_the_compiled_model_traces_one_decoder_layer_for_all_layers_and_both_models(tiny_model_dir, eager_compile_graphs):
    """Regional compilation: one graph for the policy's layers (with gradients) and one for the
    frozen copy's, not one per layer, gradient checkpointing or not. Dynamo's eager backend stands
    in for Inductor (which graphs are traced is Dynamo's business)."""
    counters = eager_compile_graphs
    model, frozen = policy_and_frozen_copy(tiny_model_dir)
    assert model.config.num_hidden_layers == 2
    batch = ragged_batch(model.config.vocab_size)
    for checkpointing in (False, True):
        if checkpointing:
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable({"use_reentrant": False})
        gradients = []
        for compiled in (True, False):
            with torch.no_grad():
                completion_logprobs(frozen, *batch, with_entropy=False, compiled_model=compiled)
            logp, _ = completion_logprobs(model, *batch, compiled_model=compiled)
            logp.sum().backward()
            gradients.append({name: p.grad.clone() for name, p in model.named_parameters()})
            model.zero_grad(set_to_none=True)
        for name in gradients[1]:
            torch.testing.assert_close(gradients[0][name], gradients[1][name], msg=f"checkpointing {checkpointing}: {name}")
        if not checkpointing:
            assert counters["stats"]["unique_graphs"] == 2
    assert not logprobs._FORWARDS.failed


def test_the_compiled_model_reuses_its_graph_for_widths_of_one_multiple(tiny_model_dir, eager_compile_graphs):
    """A batch a few tokens shorter or longer, its width rounded up to the same multiple of
    ``COMPILED_WIDTH_MULTIPLE``, runs the graphs already traced (one with gradients, one without):
    no recompilation in the middle of a fit. A batch without padding whose width is a multiple
    already gets a column more, so transformers never drops its mask (a graph without one). The
    log-probs, entropies and gradients are those of the eager model on the unpadded batch."""
    counters = eager_compile_graphs
    model, frozen = policy_and_frozen_copy(tiny_model_dir)
    vocab, multiple = model.config.vocab_size, logprobs.COMPILED_WIDTH_MULTIPLE
    # Widths of one multiple, the next above it, and a batch with no padding at all among them.
    for prompt_length, completion_length, padded in ((6, multiple - 6, False), (9, multiple + 5, True), (10, multiple + 5, False)):
        prompt_ids, completion_ids = torch.randint(0, vocab, (4, prompt_length)), torch.randint(0, vocab, (4, completion_length))
        prompt_mask, completion_mask = torch.ones_like(prompt_ids), torch.ones_like(completion_ids)
        if padded:
            prompt_mask[0, :2] = 0
            completion_mask[1, -2:] = 0
        batch = (prompt_ids, prompt_mask, completion_ids, completion_mask)
        results = []
        for compiled in (True, False):
            with torch.no_grad():
                frozen_logp, _ = completion_logprobs(frozen, *batch, with_entropy=False, compiled_model=compiled)
            logp, entropy = completion_logprobs(model, *batch, compiled_model=compiled)
            logp.sum().backward()
            results.append((frozen_logp, logp, entropy, [p.grad.clone() for p in model.parameters()]))
            model.zero_grad(set_to_none=True)
        assert results[0][1].shape == (4, completion_length)
        for got, expected in zip(results[0][:3], results[1][:3]):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        for got, expected in zip(results[0][3], results[1][3]):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 2
    assert not logprobs._FORWARDS.failed
