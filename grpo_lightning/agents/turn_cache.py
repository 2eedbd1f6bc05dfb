"""The turns of multi-turn episodes, on the HF path (:class:`HFTurns`) or the static engine (:class:`EngineTurns`).

On the HF path each turn continues from the previous turn's KV cache (:class:`TurnCache`).

After a turn, the cache holds every running episode's tokens in one batch layout: its left padding,
and the turn's tokens up to the longest turn of the batch (a shorter turn leaves masked holes after
its EOS). The next turn feeds only what the cache lacks: each episode's last sampled token (masked
where the cache holds it, so that every row ends on a real token) and the environment's reply,
left-padded to a common width. Position ids count unmasked tokens only, so every token keeps the
position it has when the whole history is fed again. A cache whose rows cannot be selected (no
``batch_select_indices``) is dropped when an episode ends, and the histories are fed again.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import LogitsProcessorList, PreTrainedTokenizerBase
from transformers.generation.utils import GenerateDecoderOnlyOutput

from grpo_lightning.rollout.engine import StaticCacheGenerator
from grpo_lightning.rollout.generation.hf import SampledTokenLogprobs, generate_from_ids, sampling_as_configured
from grpo_lightning.rollout.types import SamplingParams

#: The name ``generate`` takes the cache by, and returns it under (``past_key_values`` before transformers renamed it).
_CACHE = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"


def left_padded(sequences: list[list[int]], pad: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """``(ids, mask)`` ``[len(sequences), longest]`` of token id lists, left-padded with ``pad``."""
    width = max(len(s) for s in sequences)
    ids = torch.tensor([[pad] * (width - len(s)) + s for s in sequences], device=device)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences], device=device)
    return ids, mask


class TurnCache:
    """The running episodes' KV cache and the token layout it holds; rows follow the episodes' order."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad = pad_token_id
        self.cache = None
        self.ids: Tensor | None = None  # [A, L]: the tokens the cache holds (pads and holes included)
        self.mask: Tensor | None = None  # [A, L]: 1 where a token is part of the episode
        self.pending: list[list[int]] = []  # per row, the episode's tokens the cache lacks
        self.turn_start = 0  # where the last turn's tokens start in the layout

    def inputs(self, histories: list[list[int]], keep: list[int], device: torch.device) -> tuple[Tensor, Tensor]:
        """``input_ids`` and ``attention_mask`` of the next turn for the rows ``keep`` of the last one
        (``histories``: their whole sequences, used on the first turn only)."""
        if self.cache is not None and len(keep) < self.ids.size(0) and not hasattr(self.cache, "batch_select_indices"):
            self.cache = None  # a cache whose rows cannot be selected: feed the whole histories again
        if self.cache is None:
            return left_padded(histories, self.pad, device)
        if len(keep) < self.ids.size(0):
            self.cache.batch_select_indices(torch.tensor(keep, device=device))
        new_ids, new_mask = left_padded([self.pending[row] for row in keep], self.pad, device)
        return torch.cat([self.ids[keep], new_ids], 1), torch.cat([self.mask[keep], new_mask], 1)

    def generate(
        self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, ids: Tensor, mask: Tensor, sampling: SamplingParams
    ) -> tuple[Tensor, Tensor]:
        """``(new_ids [A, T], logprobs [A, T])`` of one turn from ``inputs``, keeping the cache."""
        recorder = SampledTokenLogprobs(sampling.temperature)
        config = sampling.generation_config(tokenizer, 1)
        config.return_dict_in_generate = True
        was_training = model.training
        model.eval()
        try:
            with sampling_as_configured(model):
                output = model.generate(
                    input_ids=ids, attention_mask=mask, generation_config=config, logits_processor=LogitsProcessorList([recorder]),
                    **({_CACHE: self.cache} if self.cache is not None else {}),
                )  # fmt: skip
        finally:
            model.train(was_training)
        self.cache = getattr(output, _CACHE)
        new_ids, self.turn_start = output.sequences[:, ids.size(1) :], ids.size(1)
        self.ids, self.mask = output.sequences[:, :-1], torch.cat([mask, torch.zeros_like(new_ids[:, :-1])], 1)
        self.pending = [[] for _ in range(new_ids.size(0))]
        return new_ids, recorder.logprobs(new_ids)

    def kept(self, row: int, length: int, last_token: int) -> None:
        """Row ``row`` kept its turn's first ``length`` tokens (the last, ``last_token``, goes in again)."""
        self.mask[row, self.turn_start : self.turn_start + length - 1] = 1
        self.pending[row] = [last_token]

    def replied(self, row: int, reply: list[int]) -> None:
        """Row ``row``'s episode goes on after the environment's ``reply``."""
        self.pending[row] += reply


class HFTurns:
    """The turns of episodes on the HF generate path: each continues :class:`TurnCache` (``reuse_cache``),
    or feeds the whole histories again."""

    def __init__(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, reuse_cache: bool = True) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.cache = TurnCache(tokenizer.pad_token_id) if reuse_cache else None
        self.previous: dict[int, int] = {}  # episode number -> its row in the last turn

    def sample(self, episodes: list[int], histories: list[list[int]], sampling: SamplingParams) -> tuple[Tensor, Tensor]:
        """``(new_ids [A, T], logprobs [A, T])``: a turn of each of the running ``episodes`` (their
        numbers, increasing) after its whole history."""
        device = next(self.model.parameters()).device
        if self.cache is None:
            ids, mask = left_padded(histories, self.tokenizer.pad_token_id, device)
            new_ids, logprobs = generate_from_ids(self.model, self.tokenizer, ids, mask, sampling, 1, True)
        else:
            inputs = self.cache.inputs(histories, [self.previous[e] for e in episodes] if self.previous else [], device)
            new_ids, logprobs = self.cache.generate(self.model, self.tokenizer, *inputs, sampling)
        self.previous = {episode: row for row, episode in enumerate(episodes)}
        return new_ids, logprobs

    def kept(self, row: int, length: int, last_token: int) -> None:
        if self.cache is not None:
            self.cache.kept(row, length, last_token)

    def replied(self, row: int, reply: list[int]) -> None:
        if self.cache is not None:
            self.cache.replied(row, reply)


class EngineTurns:
    """The turns of episodes on the static engine (:meth:`StaticCacheGenerator.sample_turn`): each
    episode keeps its row, and the engine finds what its cache lacks from the histories."""

    def __init__(self, engine: StaticCacheGenerator, tokenizer: PreTrainedTokenizerBase, episodes: int, max_history: int):
        self.engine, self.episodes = engine, episodes
        engine.start_episodes(episodes, tokenizer.eos_token_id, tokenizer.pad_token_id, max_history, return_logprobs=True)

    def sample(self, episodes: list[int], histories: list[list[int]], sampling: SamplingParams) -> tuple[Tensor, Tensor]:
        rows: list[list[int] | None] = [None] * self.episodes
        for episode, history in zip(episodes, histories):
            rows[episode] = history
        new_ids, logprobs = self.engine.sample_turn(rows, sampling)
        return new_ids[episodes], logprobs[episodes]

    def kept(self, row: int, length: int, last_token: int) -> None:
        """Nothing to do: the engine compares the next histories with what its cache holds."""

    def replied(self, row: int, reply: list[int]) -> None:
        """Nothing to do (see :meth:`kept`)."""
