"""The HF path: a group of completions per prompt with ``model.generate``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

if TYPE_CHECKING:
    from grpo_lightning.rollout import SamplingParams


@torch.no_grad()
def generate_group(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    group_size: int,
    sampling: SamplingParams,
) -> tuple[Tensor, Tensor, Tensor]:
    """Sample ``group_size`` completions for each prompt with ``model.generate``.

    Returns ``(prompt_ids [N, S], prompt_mask [N, S], completion_ids [N, T])`` with
    ``N = len(prompts) * group_size``, prompts left-padded and repeated in place.
    """
    device = next(model.parameters()).device
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    prompt_ids = encoded["input_ids"].to(device).repeat_interleave(group_size, dim=0)
    prompt_mask = encoded["attention_mask"].to(device).repeat_interleave(group_size, dim=0)
    was_training = model.training
    model.eval()
    try:
        sequences = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            generation_config=sampling.generation_config(tokenizer),
        )
    finally:
        model.train(was_training)
    completion_ids = sequences[:, prompt_ids.size(1) :]
    return prompt_ids, prompt_mask, completion_ids
