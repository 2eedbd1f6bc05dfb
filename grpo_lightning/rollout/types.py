"""The rollout data type: a group of completions per prompt, and the buffer that keeps groups between steps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor, nn
from transformers import GenerationConfig, PreTrainedTokenizerBase

#: How a group's completions are drawn (the module's ``sampling.mode``): sampled from the policy, or
#: the group's ``G`` best beams of a beam search, which are not samples of it.
ROLLOUT_MODES = ("sample", "beam_search")


@dataclass(frozen=True)
class SamplingParams:
    """How completions are drawn. ``temperature == 0`` means greedy decoding; ``beam_search``: a
    group of ``G`` is the ``G`` best beams of one beam search of ``G`` beams (no sampling: temperature,
    top-p and top-k do not apply), ranked by their mean token log-probability."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_new_tokens: int = 0
    beam_search: bool = False
    #: The ids that end a completion (:func:`end_token_ids`); empty: the tokenizer's EOS alone.
    stop_token_ids: tuple[int, ...] = ()

    def end_ids(self, tokenizer: PreTrainedTokenizerBase) -> list[int]:
        """The ids a completion ends at: ``stop_token_ids``, else the tokenizer's EOS."""
        return list(self.stop_token_ids) if self.stop_token_ids else as_ids(tokenizer.eos_token_id)

    def generation_config(self, tokenizer: PreTrainedTokenizerBase, group_size: int = 1) -> GenerationConfig:
        """The ``GenerationConfig`` of a ``generate`` call: one sampled completion per input row, or
        under beam search the ``group_size`` best of ``group_size`` beams per input row."""
        if self.beam_search:
            return GenerationConfig(
                max_new_tokens=self.max_new_tokens,
                min_new_tokens=self.min_new_tokens,
                do_sample=False,
                num_beams=group_size,
                num_return_sequences=group_size,
                length_penalty=1.0,  # a beam's score: its summed log-probability over its length
                eos_token_id=self.end_ids(tokenizer),
                pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.bos_token_id,
            )
        sampled = self.temperature > 0
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            min_new_tokens=self.min_new_tokens,
            do_sample=sampled,
            temperature=self.temperature if sampled else None,
            top_p=self.top_p if sampled else None,
            top_k=self.top_k if sampled else None,  # 0 disables top-k (None would mean 50)
            eos_token_id=self.end_ids(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
        )


@dataclass
class Rollout:
    """``N = P * G`` completions, grouped: rows ``g*G .. g*G + G - 1`` share prompt ``g``.

    Tensors: ``prompt_ids``/``prompt_mask`` ``[N, S]`` (left-padded), ``completion_ids``/
    ``completion_mask`` ``[N, T]`` (the mask covers tokens up to and including EOS),
    ``rewards`` ``[N]`` and ``reward_per_function`` ``[N, F]`` once scored, ``old_logp`` and
    ``ref_logp`` ``[N, T]`` once computed, ``sampling_logp`` ``[N, T]``: the sampled tokens'
    log-probabilities as the rollout engine computed them (when it recorded them), ``sampling_version``
    ``[N, T]`` the policy version (optimizer steps) of the weights that sampled each token. Text: ``prompts``, ``completions`` and the dataset
    ``columns`` (each a list of length ``N``).

    Multi-turn rollouts (:mod:`grpo_lightning.agents`): the completion holds the model's turns and the
    environment's replies between them; ``completion_mask`` marks the model's tokens only (the loss and
    every token count), ``environment_mask`` ``[N, T]`` the environment's, which the model attends to
    but is not trained on.

    ``derived``: what the algorithm's hooks computed from this rollout, for the hooks after them
    (PPO's GAE advantages, returns and old values, process advantages, DPO's pairs), by name: tensors
    with a row per completion (``[N, ...]``), so that a micro-batch gets its rows of each
    (:class:`MicroBatch`). Filled once the rollout is selected; :meth:`concat` leaves it empty.
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
    sampling_logp: Tensor | None = None
    environment_mask: Tensor | None = None
    derived: dict[str, Tensor] = field(default_factory=dict)
    sampling_version: Tensor | None = None

    def __len__(self) -> int:
        return self.completion_ids.size(0)

    @property
    def num_groups(self) -> int:
        return len(self) // self.group_size

    @property
    def lengths(self) -> Tensor:
        return self.completion_mask.sum(-1)

    @property
    def device(self) -> torch.device:
        return self.completion_ids.device

    def model_token_ids(self) -> list[list[int]]:
        """Each completion's token ids without padding: the model's tokens (``completion_mask``), its
        EOS included and an environment's replies left out."""
        ids, mask = self.completion_ids.cpu(), self.completion_mask.cpu().bool()
        return [row[kept].tolist() for row, kept in zip(ids, mask)]

    @property
    def attended_mask(self) -> Tensor:
        """The completion's attention mask ``[N, T]``: the model's tokens and the environment's."""
        return self.completion_mask if self.environment_mask is None else self.completion_mask + self.environment_mask

    def model_inputs(self, rows: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(prompt_ids, prompt_mask, completion_ids, attended_mask)`` of ``rows``."""
        rows = rows.to(self.device)
        return self.prompt_ids[rows], self.prompt_mask[rows], self.completion_ids[rows], self.attended_mask[rows]

    def to(self, device: torch.device | str) -> Rollout:
        """The rollout with its tensors on ``device``."""
        tensors = {f.name: getattr(self, f.name) for f in fields(self)}
        moved = {k: v.to(device) for k, v in tensors.items() if isinstance(v, Tensor)}
        return replace(self, **moved, derived={k: v.to(device) for k, v in self.derived.items()})

    def state_dict(self) -> dict[str, Any]:
        """The fields as a dict, tensors on the CPU: ``Rollout(**state)`` rebuilds the rollout."""
        moved = self.to("cpu")
        return {f.name: getattr(moved, f.name) for f in fields(moved)}

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
        picked["derived"] = {k: v[rows.to(v.device)] for k, v in self.derived.items()}
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
        for name in ("old_logp", "ref_logp", "sampling_logp", "environment_mask", "sampling_version"):
            if all(getattr(p, name) is not None for p in parts):
                merged[name] = torch.cat([pad(getattr(p, name), completion_len, 0, False) for p in parts])
        for name in ("truncated", "rewards", "reward_per_function"):
            if all(getattr(p, name) is not None for p in parts):
                merged[name] = torch.cat([getattr(p, name) for p in parts])
        for name in ("prompts", "completions"):
            merged[name] = [x for p in parts for x in getattr(p, name)]
        merged["columns"] = {k: [x for p in parts for x in p.columns[k]] for k in parts[0].columns}
        return Rollout(**merged)


@dataclass
class MicroBatch:
    """The rows of a rollout that one forward and backward pass of the update takes, with what their
    loss reads: ``rows`` ``[n]`` of the rollout; ``mask`` ``[n, T]``, the tokens that carry loss;
    ``advantages`` ``[n]`` or ``[n, T]``; the rollout's ``old_logp``, ``ref_logp`` and
    ``sampling_logp`` ``[n, T]`` where it has them (and ``sampling_version``); ``derived``: the rollout's derived tensors and
    those computed for the minibatch, at these rows; ``num_sequences`` and ``num_tokens``: the counts of
    the whole minibatch, which the aggregation divides by."""

    rows: Tensor
    mask: Tensor
    advantages: Tensor
    num_sequences: int
    num_tokens: Tensor
    old_logp: Tensor | None = None
    ref_logp: Tensor | None = None
    sampling_logp: Tensor | None = None
    derived: dict[str, Tensor] = field(default_factory=dict)
    sampling_version: Tensor | None = None

    @classmethod
    def of(
        cls, rollout: Rollout, advantages: Tensor, rows: Tensor, mask: Tensor, num_sequences: int, num_tokens: Tensor,
        minibatch_derived: dict[str, Tensor] | None = None,
    ) -> MicroBatch:  # fmt: skip
        """``rows`` of ``rollout``; ``minibatch_derived``: ``[N, ...]`` tensors of the minibatch's hooks."""
        rows = rows.to(mask.device)

        def at_rows(value: Tensor | None) -> Tensor | None:
            return None if value is None else value[rows.to(value.device)]

        derived = {name: at_rows(value) for name, value in {**rollout.derived, **(minibatch_derived or {})}.items()}
        return cls(rows, mask, at_rows(advantages), num_sequences, num_tokens, at_rows(rollout.old_logp),
                   at_rows(rollout.ref_logp), at_rows(rollout.sampling_logp), derived,
                   at_rows(rollout.sampling_version))  # fmt: skip


def as_ids(token_id: int | Sequence[int] | None) -> list[int]:
    """A token id, a list of them or ``None`` as a list."""
    return [] if token_id is None else [int(i) for i in ([token_id] if isinstance(token_id, int) else token_id)]


def end_token_ids(tokenizer: PreTrainedTokenizerBase, model: nn.Module | None = None) -> tuple[int, ...]:
    """The ids that end a completion: the tokenizer's EOS, then each end-of-turn id of ``model``'s
    generation config (``eos_token_id``: one id or several), as ``model.generate`` and TRL's
    ``GRPOTrainer`` stop. The tokenizer's EOS alone can miss the end of a turn: a chat model's may be
    ``<|endoftext|>`` while its turns end at ``<|im_end|>`` or ``<|eot_id|>``, and a GGUF file's tokenizer
    reads differently across transformers releases."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = as_ids(tokenizer.eos_token_id) + as_ids(configured)
    return tuple(dict.fromkeys(ids))


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


class RolloutBuffer:
    """Groups kept from one generation batch to the next until a batch of them is full (DAPO's
    dynamic sampling), with the counts of what was drawn.

    Held groups follow the rollouts appended to them onto their device (a buffer restored from a
    checkpoint is on the CPU), and go into checkpoints with :meth:`state_dict`.
    """

    def __init__(self) -> None:
        self.parts: list[Rollout] = []
        self.batches = 0  # generation batches drawn since the last take
        self.groups_seen = 0  # groups drawn since the last take

    @property
    def num_groups(self) -> int:
        return sum(part.num_groups for part in self.parts)

    def append(self, rollout: Rollout, groups: Tensor) -> None:
        """Count one generation batch and keep the groups of ``rollout`` that ``groups`` (a boolean
        ``[P]`` mask) marks."""
        self.batches += 1
        self.groups_seen += rollout.num_groups
        if groups.any():
            self.parts = [part.to(rollout.device) for part in self.parts]
            self.parts.append(rollout.select_groups(groups.cpu()))

    def take(self, max_groups: int, pad_token_id: int) -> Rollout | None:
        """The first ``max_groups`` groups held, as one rollout (``None`` for none); empties the buffer."""
        parts = self.parts
        self.clear()
        if max_groups <= 0 or not parts:
            return None
        batch = Rollout.concat(parts, pad_token_id)
        return batch.select_groups(torch.arange(max_groups)) if batch.num_groups > max_groups else batch

    def clear(self) -> None:
        self.parts, self.batches, self.groups_seen = [], 0, 0

    def to(self, device: torch.device | str) -> RolloutBuffer:
        self.parts = [part.to(device) for part in self.parts]
        return self

    def state_dict(self) -> dict[str, Any]:
        return {
            "kept": [part.state_dict() for part in self.parts],
            "gen_batches": self.batches,
            "groups_seen": self.groups_seen,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.parts = [Rollout(**part) for part in state["kept"]]
        self.batches = state["gen_batches"]
        self.groups_seen = state["groups_seen"]

