"""A ``transformers`` causal LM's forward pass over the static cache, with a ready 4-D mask.

The names of the cache argument and of the optional ones differ between transformers releases and
models: only those the model's ``forward`` takes are passed.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn


class StaticCacheForward:
    """``model``'s forward over a cache, returning the logits ``[B, V]`` of the last position.

    ``boolean_mask``: the model's attention takes a boolean mask (SDPA); else an additive float one
    (eager attention)."""

    def __init__(self, model: nn.Module, boolean_mask: bool) -> None:
        self.model = model
        self.boolean_mask = boolean_mask
        parameters = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self._pass_cache_position = "cache_position" in parameters
        self._pass_logits_to_keep = "logits_to_keep" in parameters

    def mask(self, allowed: Tensor) -> Tensor:
        """``allowed`` (``True`` may attend) as the model's attention takes it."""
        if self.boolean_mask:
            return allowed
        return torch.zeros(allowed.shape, device=allowed.device).masked_fill_(~allowed, torch.finfo(torch.float32).min)

    def __call__(self, cache: Any, input_ids: Tensor, allowed: Tensor, position_ids: Tensor, cache_position: Tensor) -> Tensor:
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": self.mask(allowed),
            "position_ids": position_ids,
            self._cache_argument: cache,
            "use_cache": True,
        }
        if self._pass_cache_position:
            kwargs["cache_position"] = cache_position
        if self._pass_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        return self.model(**kwargs).logits[:, -1]
