"""Micro-batches packed to a token budget (``optim.micro_batch_tokens``) instead of a fixed row count
(``optim.micro_batch_size``), as TRL's token budget and verl's dynamic batch size: long completions
go in small micro-batches, short ones in large. Memory only: every micro-batch's loss divides by the
minibatch's counts, so the accumulated gradient is the same for any split of its rows."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def pack_rows(lengths: Sequence[int], budget: int, count: int) -> tuple[list[list[int]], bool]:
    """Rows (indices into ``lengths``, the tokens of each) in ``count`` micro-batches: longest first,
    each into the micro-batch of least ``sum L^2`` (attention's cost, which verl and NeMo-RL balance)
    that keeps at most ``budget`` tokens; an empty micro-batch takes any row, so one longer than
    ``budget`` goes alone. Returns the non-empty micro-batches, each in row order, and whether every
    row fitted (a row that fits nowhere goes to the micro-batch of fewest tokens)."""
    bins: list[list[int]] = [[] for _ in range(count)]
    tokens, cost, fitted = [0] * count, [0] * count, True
    for row in sorted(range(len(lengths)), key=lambda i: -lengths[i]):  # stable: ties in row order
        size = lengths[row]
        room = [b for b in range(count) if not bins[b] or tokens[b] + size <= budget]
        fitted = fitted and bool(room)
        chosen = min(room, key=lambda b: cost[b]) if room else min(range(count), key=lambda b: tokens[b])
        bins[chosen].append(row)
        tokens[chosen] += size
        cost[chosen] += size * size
    return [sorted(rows) for rows in bins if rows], fitted


def fewest_micro_batches(lengths: Sequence[int], budget: int) -> int:
    """The fewest micro-batches :func:`pack_rows` fits ``lengths`` into: from ``ceil(sum min(L, budget) / budget)``
    up (a row over the budget fills one alone)."""
    count = max(1, math.ceil(sum(min(size, budget) for size in lengths) / budget))
    while not pack_rows(lengths, budget, count)[1]:
        count += 1  # at len(lengths) every row is alone, which always fits
    return count


def row_tokens(prompt_mask: Tensor, attended_mask: Tensor) -> list[int]:
    """Tokens of each row without padding: its prompt's and its completion's (the environment's
    replies included, which the model reads). ``[n, S]``, ``[n, T]`` -> ``n`` counts."""
    return (prompt_mask.sum(-1) + attended_mask.sum(-1)).long().tolist()


def token_budget_split(rows: Tensor, lengths: Sequence[int], budget: int, count: int | None = None) -> list[Tensor]:
    """``rows`` ``[n]`` in micro-batches of at most ``budget`` tokens (``lengths``: of each row),
    ``count`` of them (the most any device needs, so that all run the same collectives) or the fewest."""
    count = fewest_micro_batches(lengths, budget) if count is None else count
    return [rows[torch.tensor(part, dtype=torch.long, device=rows.device)] for part in pack_rows(lengths, budget, count)[0]]


def in_row_order(parts: Sequence[Tensor], micro_batches: Sequence[Tensor]) -> Tensor:
    """The results ``[n_k, ...]`` of a pass over micro-batches of the rows ``0 .. N - 1`` (in any
    order and split), put back in row order: ``[N, ...]``."""
    rows = torch.cat(list(micro_batches)).to(parts[0].device)
    return torch.cat(list(parts))[rows.argsort()]
