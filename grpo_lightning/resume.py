"""State an exact resume needs beyond weights, optimizer and loops: the random generators' states,
gathered over every process into the checkpoint."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """States of the global generators: torch (CPU and the current CUDA device), numpy, python."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if cuda else None,
        "numpy": (kind, keys.tolist(), int(pos), int(has_gauss), float(cached)),
        "python": random.getstate(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    random.setstate(state["python"])


def _process_group_ready() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def gather_over_ranks(value: Any) -> list[Any]:
    """``value`` of every process, by global rank (every process must call it)."""
    if not _process_group_ready():
        return [value]
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, value)
    return gathered


def min_over_ranks(value: int, device: torch.device) -> int:
    """The smallest ``value`` over all processes (every process must call it); ``value`` alone
    outside a multi-process run. ``device``: where the collective's tensor lives."""
    if not _process_group_ready():
        return value
    tensor = torch.tensor(value, device=device)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MIN)
    return int(tensor)
