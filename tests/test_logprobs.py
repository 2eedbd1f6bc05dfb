"""Per-token log-probs and entropy: values and gradients against the plain full-vocabulary formula."""

from __future__ import annotations

import pytest
import torch

from grpo_lightning.logprobs import position_ids_from_mask, token_logprobs_from_logits


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
