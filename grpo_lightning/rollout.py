"""Sampling a group of completions for each prompt."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor, nn
from transformers import GenerationConfig, PreTrainedTokenizerBase


@dataclass(frozen=True)
class SamplingParams:
    """How completions are drawn. ``temperature == 0`` means greedy decoding."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_new_tokens: int = 0

    def generation_config(self, tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
        sampled = self.temperature > 0
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            min_new_tokens=self.min_new_tokens,
            do_sample=sampled,
            temperature=self.temperature if sampled else None,
            top_p=self.top_p if sampled else None,
            top_k=self.top_k if sampled else None,  # 0 disables top-k (None would mean 50)
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
        )


@dataclass
class Rollout:
    """``N = P * G`` completions, grouped: rows ``g*G .. g*G + G - 1`` share prompt ``g``.

    Tensors: ``prompt_ids``/``prompt_mask`` ``[N, S]`` (left-padded), ``completion_ids``/
    ``completion_mask`` ``[N, T]`` (the mask covers tokens up to and including EOS),
    ``rewards`` ``[N]`` and ``reward_per_function`` ``[N, F]`` once scored, ``old_logp`` and
    ``ref_logp`` ``[N, T]`` once computed. Text: ``prompts``, ``completions`` and the dataset
    ``columns`` (each a list of length ``N``).
    """

    group_size: int
    prompt_ids: Tensor
    prompt_mask: Tensor
    completion_ids: Tensor
    completion_mask: Tensor
    truncated: Tensor
    prompts: list[Any]
    completions: list[str]
    columns: dict[str, list] = field(default_factory=dict)
    rewards: Tensor | None = None
    reward_per_function: Tensor | None = None
    old_logp: Tensor | None = None
    ref_logp: Tensor | None = None

    def __len__(self) -> int:
        return self.completion_ids.size(0)

    @property
    def num_groups(self) -> int:
        return len(self) // self.group_size

    @property
    def lengths(self) -> Tensor:
        return self.completion_mask.sum(-1)

    def select(self, rows: Tensor) -> Rollout:
        """The rollout restricted to ``rows`` (a 1-D index tensor)."""
        index = rows.tolist()
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                picked[f.name] = value[rows.to(value.device)]
            elif isinstance(value, list):
                picked[f.name] = [value[i] for i in index]
        picked["columns"] = {k: [v[i] for i in index] for k, v in self.columns.items()}
        return replace(self, **picked)

    def select_groups(self, groups: Tensor) -> Rollout:
        """Keep whole groups, given a boolean ``[P]`` mask or group indices."""
        if groups.dtype == torch.bool:
            groups = groups.nonzero().flatten()
        rows = (groups.unsqueeze(1) * self.group_size + torch.arange(self.group_size)).flatten()
        return self.select(rows)

    @staticmethod
    def concat(parts: list[Rollout], pad_token_id: int) -> Rollout:
        """Stack rollouts of the same group size (re-padding prompts left, completions right)."""
        if len(parts) == 1:
            return parts[0]
        prompt_len = max(p.prompt_ids.size(1) for p in parts)
        completion_len = max(p.completion_ids.size(1) for p in parts)

        def pad(t: Tensor, width: int, value: int, left: bool) -> Tensor:
            extra = width - t.size(1)
            return nn.functional.pad(t, (extra, 0) if left else (0, extra), value=value)

        merged: dict[str, Any] = {"group_size": parts[0].group_size}
        merged["prompt_ids"] = torch.cat([pad(p.prompt_ids, prompt_len, pad_token_id, True) for p in parts])
        merged["prompt_mask"] = torch.cat([pad(p.prompt_mask, prompt_len, 0, True) for p in parts])
        for name, value in (("completion_ids", pad_token_id), ("completion_mask", 0)):
            merged[name] = torch.cat([pad(getattr(p, name), completion_len, value, False) for p in parts])
        for name in ("old_logp", "ref_logp"):
            if all(getattr(p, name) is not None for p in parts):
                merged[name] = torch.cat([pad(getattr(p, name), completion_len, 0, False) for p in parts])
        for name in ("truncated", "rewards", "reward_per_function"):
            if all(getattr(p, name) is not None for p in parts):
                merged[name] = torch.cat([getattr(p, name) for p in parts])
        for name in ("prompts", "completions"):
            merged[name] = [x for p in parts for x in getattr(p, name)]
        merged["columns"] = {k: [x for p in parts for x in p.columns[k]] for k in parts[0].columns}
        return Rollout(**merged)


def completion_mask_from_ids(completion_ids: Tensor, eos_token_id: int | list[int] | None) -> tuple[Tensor, Tensor]:
    """Mask ``[N, T]`` of tokens up to and including the first EOS, and ``truncated`` ``[N]``.

    A completion with no EOS is truncated: all of it counts, and ``truncated`` is True.
    """
    if eos_token_id is None:
        is_eos = torch.zeros_like(completion_ids, dtype=torch.bool)
    else:
        eos_ids = torch.as_tensor(eos_token_id, device=completion_ids.device).flatten()
        is_eos = torch.isin(completion_ids, eos_ids)
    has_eos = is_eos.any(dim=1)
    length = completion_ids.size(1)
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, length, dtype=torch.long))
    positions = torch.arange(length, device=completion_ids.device)
    mask = (positions.unsqueeze(0) <= first_eos.unsqueeze(1)).float()
    return mask, ~has_eos


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
