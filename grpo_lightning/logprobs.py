"""Per-token log-probabilities and entropy of completions under a causal LM.

The full ``[N, T, V]`` logits of a micro-batch are never turned into fp32 at once: the LM head
output is kept to the completion positions (``logits_to_keep``) and the fp32 log-softmax runs over
chunks of rows, so the extra memory is ``chunk_rows x T x V`` floats.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding, as ``generate`` assigns them: ``cumsum(mask) - 1``."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.clamp(min=0)


def token_logprobs_from_logits(
    logits: Tensor, targets: Tensor, temperature: float = 1.0, chunk_rows: int = 8
) -> tuple[Tensor, Tensor]:
    """Log-prob of each target token and the entropy of each predictive distribution.

    Args:
        logits: ``[N, T, V]`` in any dtype; position ``t`` predicts ``targets[:, t]``.
        targets: ``[N, T]`` token ids.
        temperature: the sampling temperature; the distribution is ``softmax(logits / temperature)``.
        chunk_rows: rows converted to fp32 at a time.

    Returns:
        ``(logp, entropy)``, both fp32 ``[N, T]``; ``entropy`` carries no gradient.
    """
    logp_chunks, entropy_chunks = [], []
    for start in range(0, logits.size(0), chunk_rows):
        chunk = logits[start : start + chunk_rows].float()
        if temperature != 1.0:
            chunk = chunk / temperature
        log_norm = torch.logsumexp(chunk, dim=-1)
        picked = chunk.gather(-1, targets[start : start + chunk_rows].unsqueeze(-1)).squeeze(-1)
        logp_chunks.append(picked - log_norm)
        with torch.no_grad():
            probs = torch.softmax(chunk, dim=-1)
            entropy_chunks.append(log_norm - (probs * chunk).sum(-1))
    return torch.cat(logp_chunks), torch.cat(entropy_chunks)


def completion_logprobs(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    temperature: float = 1.0,
    chunk_rows: int = 8,
) -> tuple[Tensor, Tensor]:
    """Teacher-forced log-probs of ``completion_ids`` given left-padded ``prompt_ids``.

    Shapes: prompts ``[N, S]``, completions ``[N, T]``; returns ``(logp, entropy)`` of ``[N, T]``.
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
    return token_logprobs_from_logits(logits, completion_ids, temperature, chunk_rows)
