"""Per-token statistics of completions under a causal LM from one forward pass without gradient:
the sampled token's log-prob and ``sum_v pi(v)^2``, what OTB's realized energy reads
(:func:`grpo_lightning.algorithms.advantages.optimal_token_baseline`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from grpo_lightning.algorithms.functional import position_ids_from_mask
from grpo_lightning.models.logprobs import CHUNK_ELEMENTS


def logprob_and_sum_pi_squared(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """``(log pi(target), sum_v pi(v)^2)`` of ``pi = softmax(logits / temperature)``, fp32, with
    ``sum_v pi(v)^2 = exp(logsumexp(2 z) - 2 logsumexp(z))``, ``z = logits / temperature`` (never
    forming ``pi``). ``logits`` ``[..., V]``, ``targets`` ``[...]`` -> two ``[...]``."""
    scaled = logits.float() / temperature
    log_norm = torch.logsumexp(scaled, dim=-1)
    logp = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm
    return logp, torch.exp(torch.logsumexp(2 * scaled, dim=-1) - 2 * log_norm)


@torch.no_grad()
def completion_token_statistics(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Teacher-forced ``(logp, sum_pi_squared)`` ``[N, T]`` of ``completion_ids`` ``[N, T]`` given
    left-padded ``prompt_ids`` ``[N, S]``; 0 where ``completion_mask`` (what the model attends to) is 0.
    The fp32 arithmetic runs over chunks of rows of at most ``CHUNK_ELEMENTS`` logits."""
    if hasattr(model, "get_base_model") and hasattr(model, "disable_adapter"):
        model = model.get_base_model()  # PEFT: the Hugging Face model that holds the adapters
    width = completion_ids.size(1)
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask,
              "position_ids": position_ids_from_mask(attention_mask)}  # fmt: skip
    logits = model(**inputs, use_cache=False, logits_to_keep=width + 1).logits[:, :-1]  # position t predicts token t
    rows = max(1, CHUNK_ELEMENTS // max(1, logits.shape[1] * logits.shape[2]))
    parts = [logprob_and_sum_pi_squared(logits[i : i + rows], completion_ids[i : i + rows], temperature)
             for i in range(0, len(logits), rows)]  # fmt: skip
    counted = completion_mask.bool()
    return tuple(torch.cat(values).masked_fill(~counted, 0.0) for values in zip(*parts))
