"""Per-token log-probabilities and entropy of completions under a causal LM.

The full ``[N, T, V]`` logits of a micro-batch are never turned into fp32 at once: the LM head
output is kept to the completion positions (``logits_to_keep``) and the fp32 log-softmax runs over
chunks of rows, so the extra memory is ``chunk_rows x T x V`` floats (by default about 256 MB).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

#: fp32 elements converted at a time when ``chunk_rows`` is not given (256 MB).
CHUNK_ELEMENTS = 2**26


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding, as ``generate`` assigns them: ``cumsum(mask) - 1``."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.clamp(min=0)


class _SelectedLogProbs(torch.autograd.Function):
    """``log softmax(logits / temperature)[target]`` and the entropy, chunked over rows in fp32.

    Only the input logits (in their own dtype) are kept for the backward pass, which recomputes
    the softmax chunk by chunk: ``d logp_t / d logits_t = (onehot(target_t) - p_t) / temperature``.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, temperature: float, chunk_rows: int, with_entropy: bool):
        rows = logits.shape[0]
        logp = logits.new_empty(logits.shape[:-1], dtype=torch.float32)
        entropy = torch.empty_like(logp) if with_entropy else logp.new_empty(0)
        for start in range(0, rows, chunk_rows):
            scaled = logits[start : start + chunk_rows].float() / temperature
            log_norm = torch.logsumexp(scaled, dim=-1)
            picked = scaled.gather(-1, targets[start : start + chunk_rows].unsqueeze(-1)).squeeze(-1)
            logp[start : start + chunk_rows] = picked - log_norm
            if with_entropy:
                probs = torch.exp(scaled - log_norm.unsqueeze(-1))
                entropy[start : start + chunk_rows] = log_norm - (probs * scaled).sum(-1)
        ctx.save_for_backward(logits, targets)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor, grad_entropy: Tensor):
        logits, targets = ctx.saved_tensors
        grad_logits = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk_rows):
            rows = slice(start, start + ctx.chunk_rows)
            upstream = grad_logp[rows].unsqueeze(-1)
            grad = torch.softmax(logits[rows].float() / ctx.temperature, dim=-1).mul_(-upstream)
            grad.scatter_add_(-1, targets[rows].unsqueeze(-1), upstream)
            grad_logits[rows] = grad.div_(ctx.temperature)
        return grad_logits, None, None, None, None


def token_logprobs_from_logits(
    logits: Tensor, targets: Tensor, temperature: float = 1.0, chunk_rows: int | None = None, with_entropy: bool = True
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of each target token and the entropy of each predictive distribution.

    Args:
        logits: ``[N, T, V]`` in any dtype; position ``t`` predicts ``targets[:, t]``.
        targets: ``[N, T]`` token ids.
        temperature: the sampling temperature; the distribution is ``softmax(logits / temperature)``.
        chunk_rows: rows converted to fp32 at a time (forward and backward); by default as many
            as fit in ``CHUNK_ELEMENTS`` floats (one row of a 150k vocabulary x 256 tokens is 39M).
        with_entropy: compute the entropy (two more passes over the logits); else it is ``None``.

    Returns:
        ``(logp, entropy)``, both fp32 ``[N, T]``; ``entropy`` carries no gradient.
    """
    if chunk_rows is None:
        chunk_rows = max(1, CHUNK_ELEMENTS // max(1, logits.shape[1] * logits.shape[2]))
    logp, entropy = _SelectedLogProbs.apply(logits, targets, float(temperature), chunk_rows, with_entropy)
    return logp, entropy if with_entropy else None


def completion_logprobs(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
    with_entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Teacher-forced log-probs of ``completion_ids`` given left-padded ``prompt_ids``.

    Shapes: prompts ``[N, S]``, completions ``[N, T]``; returns ``(logp, entropy)`` of ``[N, T]``
    (``entropy`` is ``None`` unless ``with_entropy``).
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    completion_length = completion_ids.size(1)
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        logits_to_keep=completion_length + 1,
    ).logits
    # The logit at position t predicts token t + 1: drop the last one.
    logits = logits[:, -completion_length - 1 : -1]
    return token_logprobs_from_logits(logits, completion_ids, temperature, chunk_rows, with_entropy)
