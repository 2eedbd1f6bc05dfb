"""Groups of completions on the static engine, with the arguments and results of the HF path's ``generate_group``."""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from grpo_lightning.rollout.engine.generator import StaticCacheGenerator, model_device
from grpo_lightning.rollout.types import SamplingParams


@torch.no_grad()
def fast_generate_group(
    generator: StaticCacheGenerator,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    group_size: int,
    sampling: SamplingParams,
    row_keys: Tensor | None = None,
    with_logprobs: bool = False,
) -> tuple[Tensor, Tensor, Tensor] | tuple[Tensor, Tensor, Tensor, Tensor]:
    """``generate_group`` on a ``StaticCacheGenerator``: same arguments (the generator in place of the
    model) and the same ``(prompt_ids [N, S], prompt_mask [N, S], completion_ids [N, T])``, and
    ``with_logprobs`` the sampled tokens' log-probabilities ``[N, T]``.
    ``row_keys`` ``[N]``: keyed sampling (``StaticCacheGenerator.generate``), one key per completion."""
    device = model_device(generator.model)
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    prompt_ids = encoded["input_ids"].to(device).repeat_interleave(group_size, dim=0)
    prompt_mask = encoded["attention_mask"].to(device).repeat_interleave(group_size, dim=0)
    completions = generator.generate(
        prompt_ids,
        prompt_mask,
        sampling,
        eos_token_id=sampling.end_ids(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        row_keys=row_keys,
        return_logprobs=with_logprobs,
    )
    return (prompt_ids, prompt_mask, *completions) if with_logprobs else (prompt_ids, prompt_mask, completions)
