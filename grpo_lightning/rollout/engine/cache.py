"""The static KV cache of the engine: its allocation, its length, and the prefill of shared prompts.

The cache (``transformers.StaticCache``, ``batch x length``) is allocated once and reset between
rollouts. Its length is rounded up (:func:`grown_cache_len`) so that slightly longer prompts do not
reallocate it each time. A GRPO batch holds each prompt ``group_size`` times: the prefill runs each
distinct prompt once (:func:`distinct_rows`) and writes its keys and values to every row of that
prompt (:func:`shared_prefill_cache`). A decode step may read only the slots in use so far, rounded
up to one of a few bounds (:func:`slot_limits`), one CUDA graph each.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
import transformers
from torch import Tensor

CACHE_LEN_MULTIPLE = 64
"""A cache that must grow grows to a multiple of this many slots."""


SUPPORTED_ATTENTION = ("sdpa", "eager")
"""The attention implementations that take the engine's ready 4-D masks over the whole cache."""


def static_cache_attention(model: Any) -> str:
    """The attention implementation of ``model``, after checking that the static-cache path runs it:
    one of ``SUPPORTED_ATTENTION``, and full attention in every layer (no sliding window)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    attention = getattr(config, "_attn_implementation", None) or "eager"
    if attention not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"StaticCacheGenerator supports attn_implementation {SUPPORTED_ATTENTION}, the model uses "
            f"{attention!r}: load it with attn_implementation='sdpa'."
        )
    layer_types = getattr(config, "layer_types", None) or ()
    if any(kind != "full_attention" for kind in layer_types) or getattr(config, "use_sliding_window", False):
        raise ValueError("StaticCacheGenerator supports models whose layers all use full attention.")
    return attention


def new_static_cache(config: Any, batch_size: int, max_cache_len: int, device: torch.device, dtype: torch.dtype):
    """A ``transformers.StaticCache`` for ``batch_size`` rows of ``max_cache_len`` tokens.

    The constructor differs between transformers releases: older ones take the batch size, device and
    dtype and allocate at once; newer ones take only ``(config, max_cache_len)`` and allocate on the
    first update, from the shapes and dtypes of the first keys and values. Only the arguments the
    installed constructor names are passed.
    """
    parameters = inspect.signature(transformers.StaticCache.__init__).parameters
    kwargs: dict[str, Any] = {"config": config, "max_cache_len": max_cache_len}
    for name in ("max_batch_size", "batch_size"):
        if name in parameters:
            kwargs[name] = batch_size
            break
    if "device" in parameters:
        kwargs["device"] = device
    if "dtype" in parameters:
        kwargs["dtype"] = dtype
    return transformers.StaticCache(**kwargs)


def grown_cache_len(cache_len: int, needed_len: int) -> int:
    """``cache_len``, or ``needed_len`` rounded up to a multiple of ``CACHE_LEN_MULTIPLE`` when it is longer."""
    if needed_len <= cache_len:
        return cache_len
    return -(-needed_len // CACHE_LEN_MULTIPLE) * CACHE_LEN_MULTIPLE


def distinct_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """``(distinct, inverse)`` for ``rows`` ``[N, K]``: the index of one occurrence of each distinct
    row and, for each row, the position of its own in ``distinct``: ``rows[distinct][inverse]``
    equals ``rows``."""
    unique, inverse = torch.unique(rows, dim=0, return_inverse=True)
    order = torch.arange(len(rows), device=rows.device)
    distinct = torch.full((len(unique),), len(rows), device=rows.device).scatter_reduce_(0, inverse, order, "amin")
    return distinct, inverse


def shared_prefill_cache(cache: Any, distinct: Tensor, inverse: Tensor, written: set[int]) -> Any:
    """``cache`` for a forward pass of the rows ``distinct`` of a batch: a shallow copy (the same
    layers and buffers) whose ``update`` writes each layer's keys and values to every row of the
    batch (row ``i`` gets those of ``distinct[inverse[i]]``), adds the layer's index to ``written``
    and returns the distinct rows' view of the cache to attend over."""
    shared = copy.copy(cache)

    def update(key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        keys, values = cache.update(key_states[inverse], value_states[inverse], layer_idx, *args, **kwargs)
        written.add(layer_idx)
        return keys[distinct], values[distinct]

    shared.update = update
    return shared


MAX_SLOT_LIMITS = 8
"""Most CUDA graphs captured per sampling setting, one for each bound on the cache slots read."""
SLOT_LIMIT_BLOCK = 64
"""The bounds are multiples of this many slots: a block of the attention kernel's loop."""


def slot_limits(
    first: int, last: int, cache_len: int, block: int = SLOT_LIMIT_BLOCK, most: int = MAX_SLOT_LIMITS
) -> list[int]:
    """Increasing bounds on the cache slots that decode steps read, for steps that use from ``first``
    to ``last`` slots (the prompt and the tokens so far): the multiples of one width from the first
    ``>= first`` to the first ``>= last``, the width the smallest multiple of ``block`` that gives
    at most ``most`` of them; the last one lowered to ``cache_len`` if it is above. A step that uses
    ``n`` slots reads up to the first bound ``>= n``."""
    if not 1 <= first <= last <= cache_len or most < 2:
        raise ValueError(
            f"slot_limits needs 1 <= first <= last <= cache_len and most >= 2, got {first}, {last}, {cache_len}, {most}"
        )
    width = block
    while -(-last // width) - -(-first // width) + 1 > most:
        width += block
    bounds = [k * width for k in range(-(-first // width), -(-last // width) + 1)]
    bounds[-1] = min(bounds[-1], cache_len)
    return bounds
