"""Sampling a rollout: prompts as text, completions on the path an
:class:`~grpo_lightning.rollout.generation.choice.EnginePlan` chose, and the :class:`Rollout` they make."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from grpo_lightning.rollout.engine import StaticCacheGenerator, fast_generate_group
from grpo_lightning.rollout.engine.generator import model_device
from grpo_lightning.rollout.generation.ahead import SamplesAhead
from grpo_lightning.rollout.generation.choice import EnginePlan, EngineTarget, resolve_engine
from grpo_lightning.rollout.generation.compile_payback import FitLength
from grpo_lightning.rollout.generation.hf import generate_group
from grpo_lightning.rollout.generation.weights import samples_from_shards
from grpo_lightning.rollout.types import Rollout, SamplingParams, completion_mask_from_ids
from grpo_lightning.errors import ConfigError
from grpo_lightning.runtime.strategies import is_sharded


def sampling_keys(seed: int, rollout_number: int, texts: Sequence[str], group_size: int) -> Tensor:
    """Keys of keyed sampling, one per completion ``[len(texts) * group_size]``: a hash of the seed,
    the rollout's number, the prompt text, the how-many-th copy of that text in the batch it is, and
    the completion's index in its group. Independent of the prompt's place in the batch, so the same
    prompts sample the same completions whatever the batch composition or number of devices."""
    seen: dict[str, int] = {}
    keys = []
    for text in texts:
        copy = seen[text] = seen.get(text, -1) + 1
        for index in range(group_size):
            digest = hashlib.blake2b(f"{seed}|{rollout_number}|{copy}|{index}|".encode() + text.encode(), digest_size=8)
            keys.append(int.from_bytes(digest.digest(), "little") >> 1)  # non-negative int64
    return torch.tensor(keys, dtype=torch.int64)


def ahead_key(model: nn.Module, texts: Sequence[str], *arguments: Any) -> tuple:
    """What a rollout sampled ahead is found by: the model, the prompts and the other arguments of
    :meth:`RolloutSampler.sample` (a model's weights may change in place: they are not part of it)."""
    return (id(model), tuple(texts), *arguments)


class RolloutSampler:
    """Samples groups of completions with ``model.generate`` or the static engine, as ``plan`` says.

    A static engine (its cache and captured decode steps) is kept for each of the last two models
    sampled from (a stale snapshot in training, the policy in validation); it is rebuilt for a larger
    batch. ``seed``: keyed sampling (:func:`sampling_keys`), static engine only. :meth:`sample_ahead`
    draws a rollout on a worker while the caller goes on; :meth:`sample` with the same arguments
    then returns it.
    """

    def __init__(self, plan: EnginePlan, seed: int | None = None) -> None:
        self.plan = plan
        self.seed = seed
        self.engines: dict[int, StaticCacheGenerator] = {}  # by id of the model, the last used last
        self.ahead = SamplesAhead()
        self.marked: set[str] = set()

    @classmethod
    def announced(
        cls, policy: nn.Module, strategy: Any, kind: str, options: Any, seed: int | None, beam_search: bool = False,
        fit: FitLength | None = None,
    ) -> RolloutSampler:
        """The sampler of a device of ``kind`` (``"cuda"``, ``"cpu"``), on the engine options
        resolved for it, the policy, the strategy, the rollout mode and the run's length
        (:func:`resolve_engine`), announced."""
        gathered = samples_from_shards(policy, strategy)
        target = EngineTarget.of(policy, kind, is_sharded(policy), gathered)
        plan = resolve_engine(options, target, seed, beam_search, fit)
        plan.announce()
        return cls(plan, seed=seed)

    def sample(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        texts: list[str],
        group_size: int,
        sampling: SamplingParams,
        rollout_number: int = 0,
        with_logprobs: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """``(prompt_ids [N, S], prompt_mask [N, S], completion_ids [N, T], logprobs)``,
        ``N = len(texts) * group_size``; ``logprobs``: the sampled tokens' log-probabilities ``[N, T]``
        as the engine computed them (``with_logprobs``), else ``None``."""
        ahead = self.ahead.take(ahead_key(model, texts, group_size, sampling, rollout_number, with_logprobs))
        if ahead is not None:
            return ahead
        return self._sample(model, tokenizer, texts, group_size, sampling, rollout_number, with_logprobs)

    def _sample(self, model, tokenizer, texts, group_size, sampling, rollout_number, with_logprobs, ahead=False):
        if self.plan.rollout == "hf":
            sampled = generate_group(model, tokenizer, texts, group_size, sampling, with_logprobs)
            return sampled if with_logprobs else (*sampled, None)
        if sampling.beam_search:
            raise ConfigError("sampling.mode: 'beam_search' runs on the HF generate path only; set engine.rollout 'hf'.")
        keys = None if self.seed is None else sampling_keys(self.seed, rollout_number, texts, group_size)
        engine = self._engine(model, len(texts) * group_size, sampling)
        # Ahead, on CUDA: every decode step is queued at once, without a host check for finished rows every
        # 16, and the worker waits for its stream without the GIL; a Python thread that keeps asking for
        # the GIL while the update runs slows both down several times over (measured: 0.38 s to 6 s).
        engine.check_every = sampling.max_new_tokens if ahead and model_device(model).type == "cuda" else None
        sampled = fast_generate_group(engine, tokenizer, texts, group_size, sampling, keys, with_logprobs)
        # The decode step compiles for its cache length: a validation rollout of another length is not the fit's.
        same_length = self.plan.compiled.get("decode", {}).get("max_new_tokens") == sampling.max_new_tokens
        self.compiled_and_ran("kernels", *(("decode",) if same_length else ()))
        return sampled if with_logprobs else (*sampled, None)

    def compiled_and_ran(self, *parts: str) -> None:
        """Record, once per process, that these parts of the plan have compiled and run, so that the next
        process finds their compile cache warm (:meth:`EnginePlan.mark_compiled`)."""
        new = [part for part in parts if part not in self.marked]
        self.marked.update(new)
        self.plan.mark_compiled(*new)

    def sample_ahead(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        texts: list[str],
        group_size: int,
        sampling: SamplingParams,
        rollout_number: int = 0,
        with_logprobs: bool = False,
    ) -> None:
        """Start :meth:`sample` with these arguments on the worker (:class:`SamplesAhead`); the
        ``sample`` call with the same arguments returns its result. ``model``'s weights must stay
        as they are until then."""
        arguments = (model, tokenizer, texts, group_size, sampling, rollout_number, with_logprobs)
        key = ahead_key(model, texts, group_size, sampling, rollout_number, with_logprobs)
        self.ahead.submit(key, model_device(model), lambda: self._sample(*arguments, ahead=True))

    def has_ahead(self, model, tokenizer, texts, group_size, sampling, rollout_number=0, with_logprobs=False) -> bool:
        """Whether :meth:`sample_ahead` started the rollout of these arguments (and it was not taken)."""
        return self.ahead.has(ahead_key(model, texts, group_size, sampling, rollout_number, with_logprobs))

    def _engine(self, model: nn.Module, rows: int, sampling: SamplingParams) -> StaticCacheGenerator:
        engine = self.engines.pop(id(model), None)
        if engine is None or rows > engine.max_batch_size or engine.model is not model:
            if engine is not None:
                engine.clear()
            # Sized to the largest batch seen (a validation batch may come first), not chunked.
            engine = StaticCacheGenerator(
                model,
                max_batch_size=rows,
                max_cache_len=sampling.max_new_tokens + 64,
                compile=self.plan.compile,
                decode_attention=self.plan.decode_attention,
                fuse_projections=self.plan.fuse_projections,
                qkv_kernel=None if self.plan.triton_kernels else False,
                sampling_kernel=None if self.plan.triton_kernels else False,
            )
        self.engines[id(model)] = engine
        while len(self.engines) > 2:  # the least recently used first
            self.engines.pop(next(iter(self.engines))).clear()
        return engine

    def turn_engine(self, model: nn.Module, rows: int, sampling: SamplingParams) -> StaticCacheGenerator | None:
        """The static engine that samples multi-turn episodes of ``rows`` rows from ``model``, or
        ``None`` where the plan samples on the HF path."""
        return self._engine(model, rows, sampling) if self.plan.rollout == "static" else None

    @property
    def engine(self) -> StaticCacheGenerator | None:
        """The engine of the last model sampled from."""
        return next(reversed(self.engines.values()), None)

    def release(self) -> None:
        """Free the static engines' caches once the worker is idle, keeping what it sampled ahead.

        An engine is sized to the largest batch it served: after a validation of more rows than a
        rollout (greedy and pass@k completions of a whole validation batch), its cache, and the
        reference's, would otherwise hold that memory through training. The next rollout allocates
        a cache of its own size."""
        self.ahead.wait()
        for engine in self.engines.values():
            engine.clear()
        self.engines.clear()

    def clear(self) -> None:
        """Free the static engines' caches and compiled steps (after the worker is done), and drop
        what it sampled ahead."""
        self.ahead.clear()
        self.release()


def format_prompt(tokenizer: PreTrainedTokenizerBase, prompt: Any, use_chat_template: bool = True) -> str:
    """Plain text for the model: chat messages (or plain text, when the tokenizer has a chat
    template and ``use_chat_template``) go through the template."""
    if isinstance(prompt, str) and not (use_chat_template and tokenizer.chat_template):
        return prompt
    if not isinstance(prompt, str) and not tokenizer.chat_template:
        raise ConfigError(
            "data: the prompts are chat messages and the tokenizer has no chat template to render them; give "
            "--model.policy.tokenizer one that has (an instruct model's), or plain-text prompts."
        )
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prompt_format_note(tokenizer: PreTrainedTokenizerBase, use_chat_template: bool) -> str:
    """What :func:`format_prompt` does with plain-text prompts, and the setting that changes it."""
    if not tokenizer.chat_template:
        return (
            "prompts: plain text is sent as it is (the tokenizer has no chat template); "
            "chat-message prompts need a tokenizer with one"
        )
    if use_chat_template:
        return (
            "prompts: plain text is wrapped in the tokenizer's chat template (policy.use_chat_template: true); "
            "set --model.policy.use_chat_template false to send prompts as they are"
        )
    return (
        "prompts: plain text is sent as it is (policy.use_chat_template: false); "
        "set --model.policy.use_chat_template true to wrap it in the tokenizer's chat template"
    )


def announce_prompt_format(
    tokenizer: PreTrainedTokenizerBase, use_chat_template: bool, end_ids: list[int] | None = None
) -> None:
    """Say once (rank zero, info) how plain-text prompts reach the model (:func:`prompt_format_note`) and,
    given ``end_ids`` (:meth:`SamplingParams.end_ids`), which tokens end a completion."""
    rank_zero_info(prompt_format_note(tokenizer, use_chat_template))
    if end_ids is not None:
        names = ", ".join(f"{tokenizer.convert_ids_to_tokens(i)!r} ({i})" for i in end_ids)
        rank_zero_info(f"completions end at {names}: the tokenizer's EOS and the model's generation_config.eos_token_id")


#: What ``sampling.mode: beam_search`` changes in the algorithm, said once when a fit starts.
BEAM_SEARCH_CAVEAT = (
    "sampling.mode 'beam_search': each group is the group_size best beams of a beam search, not samples from the "
    "policy. The importance ratio pi / pi_old and the group's reward mean and std no longer estimate the "
    "expectations over the policy's samples that GRPO's objective is written with: the update is a heuristic, "
    "not an estimate of the policy gradient."
)


def announce_rollout_mode(rollout_mode: str) -> None:
    """Warn once (rank zero) when the completions are not samples of the policy (:data:`BEAM_SEARCH_CAVEAT`)."""
    if rollout_mode == "beam_search":
        rank_zero_warn(BEAM_SEARCH_CAVEAT)


def build_rollout(
    tokenizer: PreTrainedTokenizerBase,
    batch: dict[str, list],
    group_size: int,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    sampling_logp: Tensor | None = None,
    end_ids: list[int] | None = None,
) -> Rollout:
    """The :class:`Rollout` of sampled ids: completion masks up to the first of ``end_ids`` (the ids
    the sampling stopped at, :meth:`SamplingParams.end_ids`; ``None``: the tokenizer's EOS), decoded
    completions, and the batch's prompts and other columns repeated for each completion of their group."""
    ends = tokenizer.eos_token_id if end_ids is None else end_ids
    completion_mask, truncated = completion_mask_from_ids(completion_ids, ends)
    completions = tokenizer.batch_decode(
        completion_ids.masked_fill(completion_mask == 0, tokenizer.pad_token_id), skip_special_tokens=True
    )

    def repeat(values: list) -> list:
        return [v for v in values for _ in range(group_size)]

    columns = {k: repeat(v) for k, v in batch.items() if k not in ("prompt", "completion", "completions")}
    return Rollout(
        group_size=group_size,
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        truncated=truncated,
        prompts=repeat(list(batch["prompt"])),
        completions=completions,
        columns=columns,
        # 0 past each completion's end (not -inf * 0: a processor may have banned the padding there)
        sampling_logp=None if sampling_logp is None else torch.where(completion_mask.bool(), sampling_logp, 0.0),
    )
