"""Partial rollouts: generation that goes on across weight updates, as an asynchronous sampler that
new weights interrupt continues its unfinished completions with them (AReaL's interruptible
generation: the prefix is recomputed under the new weights, not taken from a stale KV cache), on the
HF generate path or in the static-cache engine (``engine.rollout: static``), which prefills the prompt
and the tokens so far and samples the chunk as it samples a rollout.

A completion is built in chunks: :func:`cut` keeps the first chunk of a sampled rollout, and
:func:`continue_rollouts` samples the next chunk of every unfinished completion of several rollouts
(those in flight) with the model's current weights, in one call where their chunks have the same
bounds. Each token keeps the log-prob and the policy version it was sampled with
(``rollout.sampling_logp``, ``rollout.sampling_version``), so one completion may span versions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from grpo_lightning.rollout.generation.hf import generate_from_ids
from grpo_lightning.rollout.types import Rollout, SamplingParams

#: One completion: its token ids, their sampling log-probs and policy versions.
Completion = tuple[list[int], list[float], list[int]]


def completions_of(rollout: Rollout) -> list[Completion]:
    """Each row's completion up to its length (``completion_mask``)."""
    lengths = rollout.completion_mask.sum(dim=1).long().tolist()
    ids = rollout.completion_ids.tolist()
    logp = rollout.sampling_logp.tolist() if rollout.sampling_logp is not None else [[0.0] * len(r) for r in ids]
    versions = rollout.sampling_version.tolist() if rollout.sampling_version is not None else [[0] * len(r) for r in ids]
    return [(i[:n], p[:n], v[:n]) for i, p, v, n in zip(ids, logp, versions, lengths)]


def with_completions(
    rollout: Rollout, completions: list[Completion], tokenizer: PreTrainedTokenizerBase, end_ids: Sequence[int]
) -> Rollout:
    """``rollout`` with these completions, right-padded: masks, ``truncated`` (not ended at one of
    ``end_ids``, :meth:`SamplingParams.end_ids`) and the decoded text follow them."""
    width, eos, pad = max(1, max(len(ids) for ids, _, _ in completions)), set(end_ids), tokenizer.pad_token_id
    device = rollout.completion_ids.device

    def padded(values: list[list], fill, dtype: torch.dtype) -> Tensor:
        return torch.tensor([row + [fill] * (width - len(row)) for row in values], dtype=dtype, device=device)

    ids = padded([c[0] for c in completions], pad, rollout.completion_ids.dtype)
    mask = padded([[1] * len(c[0]) for c in completions], 0, rollout.completion_mask.dtype)
    truncated = torch.tensor([not (c[0] and c[0][-1] in eos) for c in completions], device=device)
    return replace(
        rollout, completion_ids=ids, completion_mask=mask, truncated=truncated,
        completions=tokenizer.batch_decode(ids.masked_fill(mask == 0, pad), skip_special_tokens=True),
        sampling_logp=padded([c[1] for c in completions], 0.0, torch.float32),
        sampling_version=padded([c[2] for c in completions], 0, torch.long),
    )  # fmt: skip


def cut(rollout: Rollout, tokens: int, tokenizer: PreTrainedTokenizerBase, end_ids: Sequence[int]) -> Rollout:
    """The first ``tokens`` tokens of each completion (those a sample of ``tokens`` tokens draws)."""
    return with_completions(rollout, [(i[:tokens], p[:tokens], v[:tokens]) for i, p, v in completions_of(rollout)],
                            tokenizer, end_ids)  # fmt: skip


def unfinished(completion: Completion, eos: set[int], max_new_tokens: int) -> bool:
    ids = completion[0]
    return len(ids) < max_new_tokens and not (ids and ids[-1] in eos)


@torch.no_grad()
def continue_rollouts(
    model: nn.Module, tokenizer: PreTrainedTokenizerBase, rollouts: list[Rollout], sampling: SamplingParams,
    tokens: int, version: int, engine_for: Callable[[int], Any | None] = lambda rows: None,
) -> tuple[list[Rollout], int]:  # fmt: skip
    """Sample up to ``tokens`` more tokens of each unfinished completion (no EOS yet, shorter than
    ``sampling.max_new_tokens``) of every rollout with ``model`` (policy ``version``) after its prompt
    and its tokens so far; ``(rollouts, tokens added)``. A rollout's unfinished completions all have the
    same length (each chunk adds ``tokens`` unless it ends), so the rollouts whose chunks have the same
    bounds (``max_new_tokens`` and ``min_new_tokens`` less what is done: all of them but a last, shorter
    chunk) are sampled together, in one call. ``engine_for(rows)``: a
    :class:`~grpo_lightning.rollout.engine.StaticCacheGenerator` of ``model`` for that many rows that
    samples the chunk, or ``None`` (the HF generate path)."""
    ends = sampling.end_ids(tokenizer)
    eos = set(ends)
    completions = [completions_of(rollout) for rollout in rollouts]
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}  # chunk bounds -> (rollout, row) of every active row
    for index, rows in enumerate(completions):
        active = [row for row, c in enumerate(rows) if unfinished(c, eos, sampling.max_new_tokens)]
        if active:
            done = len(rows[active[0]][0])
            bounds = (min(tokens, sampling.max_new_tokens - done), max(0, sampling.min_new_tokens - done))
            groups.setdefault(bounds, []).extend((index, row) for row in active)
    added = 0
    for (max_new, min_new), members in groups.items():
        histories = [rollouts[i].prompt_ids[row][rollouts[i].prompt_mask[row] > 0].tolist() + completions[i][row][0]
                     for i, row in members]  # fmt: skip
        width, device = max(len(h) for h in histories), rollouts[members[0][0]].device
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(h)) + h for h in histories], device=device)
        mask = torch.tensor([[0] * (width - len(h)) + [1] * len(h) for h in histories], device=device)
        chunk = replace(sampling, max_new_tokens=max_new, min_new_tokens=min_new)
        engine = engine_for(len(members))
        if engine is None:
            new_ids, new_logp = generate_from_ids(model, tokenizer, ids, mask, chunk, 1, True)
        else:
            new_ids, new_logp = engine.generate(ids, mask, chunk, ends, tokenizer.pad_token_id,
                                                return_logprobs=True)  # fmt: skip
        for (i, row), new, logp in zip(members, new_ids.tolist(), new_logp.tolist()):
            length = next((n + 1 for n, token in enumerate(new) if token in eos), len(new))
            old_ids, old_logp, old_versions = completions[i][row]
            completions[i][row] = (old_ids + new[:length], old_logp + logp[:length], old_versions + [version] * length)
            added += length
    touched = {i for members in groups.values() for i, _ in members}
    continued = [with_completions(rollout, completions[i], tokenizer, ends) if i in touched else rollout
                 for i, rollout in enumerate(rollouts)]  # fmt: skip
    return continued, added
