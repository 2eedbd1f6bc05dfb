"""Multi-turn episodes on the static engine: each turn continues the cache the turns before it left.

An episode keeps its row of the batch for the whole rollout. A turn decodes every running row until
its EOS; the rows whose episode is over ride along as finished rows, so the batch keeps the one shape
the cache and the CUDA graphs have. Then the caller extends each history (the turn's tokens it kept,
the environment's reply), and the next turn writes to the cache only what it lacks: each row's new
tokens, left-padded to one width, in one prefill at the slots after the last turn's. The slots a row
did not keep (after its EOS, up to the longest turn of the batch) are masked out, and position ids
count each row's own tokens, so every token gets the keys and values that feeding its whole history
again gives. Where a history does not extend what the cache holds, or the cache has no room for the
next turn, the histories are prefilled again from the first slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from grpo_lightning.rollout.engine.buffers import stop_ids
from grpo_lightning.rollout.types import SamplingParams


@dataclass
class EpisodeLayout:
    """What the cache holds for each episode's row, on the host."""

    rows: int
    eos_ids: list[int]
    pad: int
    max_history: int
    record_logprobs: bool
    held: list[list[int]] = field(default_factory=list)  # per row: the history the cache holds, in order
    decoded: list[list[int]] = field(default_factory=list)  # per row: the last turn's tokens fed to decode steps
    riding: list[bool] = field(default_factory=list)  # per row: its episode was over at the last turn
    frontier: int = 0  # cache slots written so far
    turn_start: int = 0  # the slot of the last turn's first decode step
    limits: list[int] = field(default_factory=list)
    graphs: dict | None = None
    use_graph: bool | None = None  # None: no turn yet

    def pending(self, histories: Sequence[list[int] | None]) -> list[tuple[int, list[int]]] | None:
        """Per row, ``(kept, new)``: how many of the last turn's decoded tokens the row's history goes
        on with (the cache holds them), and the tokens after those, which the cache lacks (at least
        one: the next turn samples from the last one's logits); ``(0, [])`` for a row whose episode is
        over. ``None`` where a history does not extend what the cache holds."""
        found = []
        for row, history in enumerate(histories):
            if history is None:
                found.append((0, []))
                continue
            held = self.held[row]
            if self.riding[row] or history[: len(held)] != held or len(history) <= len(held):
                return None
            rest, decoded, kept = history[len(held) :], self.decoded[row], 0
            while kept < min(len(rest) - 1, len(decoded)) and rest[kept] == decoded[kept]:
                kept += 1
            found.append((kept, rest[kept:]))
        return found


class EpisodeTurns:
    """The multi-turn methods of :class:`~grpo_lightning.rollout.engine.StaticCacheGenerator` (a mixin: they
    run on its cache, buffers and decode steps); see the module docstring."""

    def start_episodes(
        self, rows: int, eos_token_id: int | Sequence[int] | None, pad_token_id: int | None, max_history: int,
        return_logprobs: bool = False,
    ) -> None:  # fmt: skip
        """Begin a rollout of ``rows`` episodes whose histories (prompt, turns, replies) stay within
        ``max_history`` tokens; ``return_logprobs``: :meth:`sample_turn` returns the sampled tokens' log-probs."""
        if not 1 <= rows <= self.max_batch_size:
            raise ValueError(f"start_episodes: rows must be from 1 to max_batch_size ({self.max_batch_size}), got {rows}")
        self._episodes = EpisodeLayout(rows, *stop_ids(eos_token_id, pad_token_id), max_history, return_logprobs)

    @torch.no_grad()
    def sample_turn(self, histories: Sequence[list[int] | None], sampling: SamplingParams) -> tuple[Tensor, Tensor | None]:
        """The next turn of each episode, ``[rows, T]`` (``T <= sampling.max_new_tokens``, as
        :meth:`generate` returns completions), after its whole history ``histories[row]`` (token
        ids: the prompt, then every turn's tokens and reply); ``None`` for an episode that is over
        (its row is padding). With ``return_logprobs``: also their log-probs ``[rows, T]``, else ``None``."""
        layout = self._episodes
        if layout is None or len(histories) != layout.rows or all(h is None for h in histories):
            raise ValueError("sample_turn: call start_episodes first, and give one history per row, some not None")
        longest = max(len(h) for h in histories if h is not None)
        if longest > layout.max_history:
            raise ValueError(f"sample_turn: a history of {longest} tokens is over max_history ({layout.max_history})")
        b = self._buffers if layout.use_graph is not None else None
        with self._rolling_out():
            if b is None:  # the first turn: the cache, buffers and graphs for the whole rollout
                layout.use_graph = self._begin(layout.max_history + sampling.max_new_tokens, sampling, layout.eos_ids,
                                               layout.pad, None, layout.record_logprobs)  # fmt: skip
                b = self._buffers
            if longest + sampling.max_new_tokens > self.max_cache_len:
                raise ValueError(
                    f"sample_turn: {sampling.max_new_tokens} new tokens after a history of {longest} are over the cache "
                    f"({self.max_cache_len} slots, sized on the first turn); a later turn may not sample more tokens"
                )
            pending = layout.pending(histories) if layout.held else None
            width = 0 if pending is None else max(len(new) for _, new in pending)
            if pending is None or layout.frontier + width + sampling.max_new_tokens - 1 > self.max_cache_len:
                logits = self._prefill_histories(histories, sampling)
            else:
                logits = self._append(pending, width)
            riding = [h is None for h in histories]
            b.finished[: layout.rows] = torch.tensor(riding, device=b.finished.device)
            b.finished[layout.rows :] = True
            b.min_new.fill_(sampling.min_new_tokens)
            first_slot = layout.frontier
            steps = self._decode(logits, sampling, layout.rows, first_slot, layout.limits, layout.graphs)
            ids, logprobs = b.completions(layout.rows, steps, layout.record_logprobs)
            decoded = b.out[: layout.rows, : steps - 1].tolist()
        layout.held = [[] if h is None else list(h) for h in histories]
        layout.decoded = [[] if r else d for r, d in zip(riding, decoded)]
        layout.riding = riding
        layout.turn_start, layout.frontier = first_slot, first_slot + steps - 1
        return ids, logprobs

    def _prefill_histories(self, histories: Sequence[list[int] | None], sampling: SamplingParams) -> Tensor:
        """Reset the cache and prefill the whole histories, left-padded (a finished episode's row:
        a copy of the first running one, prefilled once with it); on the first turn, capture the
        decode step's graphs too. The logits ``[B, V]`` of each row's last token."""
        layout = self._episodes
        first = next(h for h in histories if h is not None)
        rows = [first if h is None else h for h in histories]
        width = max(len(h) for h in rows)
        ids = torch.tensor([[layout.pad] * (width - len(h)) + h for h in rows])
        mask = torch.tensor([[0] * (width - len(h)) + [1] * len(h) for h in rows])
        ids, mask = self._filled(ids, mask)
        logits = self._prefill(ids, mask)
        if not layout.limits:
            layout.limits = self._slot_limits(width + 1, self.max_cache_len)
            layout.graphs, captured = self._step_graphs(sampling, layout.limits, layout.use_graph)
            if captured:
                logits = self._prefill(ids, mask)  # the warm-up steps used the cache
        layout.frontier = width
        return logits

    def _append(self, pending: list[tuple[int, list[int]]], width: int) -> Tensor:
        """Mask out the last turn's slots each row did not keep, and prefill each row's new tokens,
        left-padded to ``width``, at the slots after the last turn's. The logits ``[B, V]`` of each
        row's last token."""
        layout, b = self._episodes, self._buffers
        device, rows, start, end = b.out.device, layout.rows, layout.turn_start, layout.frontier
        kept = torch.tensor([k for k, _ in pending], device=device)
        b.key_valid[:rows, start:end] &= b.arange[: end - start].unsqueeze(0) < kept.unsqueeze(1)
        batch = b.key_valid.size(0)
        ids = torch.full((batch, width), layout.pad, dtype=torch.long)
        mask = torch.zeros(batch, width, dtype=torch.bool)
        positions = torch.zeros(batch, width, dtype=torch.long)
        for row, ((k, new), held) in enumerate(zip(pending, layout.held)):
            if new:
                ids[row, width - len(new) :] = torch.tensor(new)
                mask[row, width - len(new) :] = True
                positions[row] = torch.arange(width) - (width - len(new)) + len(held) + k  # held: the whole last history
        ids, mask, positions = ids.to(device), mask.to(device), positions.clamp_(min=0).to(device)
        slots = b.arange[end : end + width]
        b.key_valid[:, end : end + width] = mask
        allowed = (b.arange.unsqueeze(0) <= slots.unsqueeze(1)).unsqueeze(0) & b.key_valid.unsqueeze(1)  # [B, W, L]
        allowed[:, torch.arange(width, device=device), slots] = True  # a padding query attends to itself
        logits = self._forward(self._cache, ids, allowed.unsqueeze(1), positions, slots)
        b.positions.copy_(positions[:, -1:] + 1)
        b.cache_position.fill_(end + width)
        b.step.zero_()
        layout.frontier = end + width
        return logits
