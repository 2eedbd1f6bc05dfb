"""The HF path: a group of completions per prompt with ``model.generate``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from transformers import GenerationConfig, GenerationMixin, LogitsProcessor, LogitsProcessorList, PreTrainedTokenizerBase

if TYPE_CHECKING:
    from grpo_lightning.rollout.types import SamplingParams


class SampledTokenLogprobs(LogitsProcessor):
    """Records the log-probability of each sampled token under ``softmax(logits / temperature)``
    (temperature 1 when greedy), as the static engine does: at each step, the previous step's
    log-probabilities are read at the token it sampled (the last of ``input_ids``). transformers runs
    it after its own processors and before the temperature, top-k and top-p warpers, so it sees the
    logits that a teacher-forced pass computes, except that ``min_new_tokens`` has blocked EOS."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature if temperature > 0 else 1.0
        self.previous: Tensor | None = None
        self.values: list[Tensor] = []

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if self.previous is not None:
            self.values.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
        self.previous = (scores.float() / self.temperature).log_softmax(dim=-1)
        return scores

    def logprobs(self, completion_ids: Tensor) -> Tensor:
        """``[N, T]`` log-probabilities of ``completion_ids``, the tokens generated while recording."""
        values = list(self.values)
        if self.previous is not None and len(values) < completion_ids.size(1):
            values.append(self.previous.gather(1, completion_ids[:, -1:]).squeeze(1))
        return torch.stack(values, dim=1) if values else completion_ids.new_zeros(completion_ids.shape, dtype=torch.float32)


@contextlib.contextmanager
def sampling_as_configured(model: nn.Module) -> Iterator[None]:
    """Inside the block, ``model.generate`` fills what a call's ``GenerationConfig`` leaves unset from
    transformers' defaults, not from the checkpoint's ``generation_config.json``: a ``repetition_penalty``,
    ``no_repeat_ngram_size`` or ``min_p`` shipped there would change the distribution sampled from (and
    validation's greedy answers), while the static engine and the loss's log-probs never apply them.
    ``model`` may wrap the Hugging Face model (LoRA, compiled): the first such module inside is changed."""
    owner = next((m for m in model.modules() if isinstance(m, GenerationMixin) and hasattr(m, "generation_config")), None)
    if owner is None:
        yield
        return
    saved, owner.generation_config = owner.generation_config, GenerationConfig()
    try:
        yield
    finally:
        owner.generation_config = saved


@torch.no_grad()
def generate_group(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    group_size: int,
    sampling: SamplingParams,
    with_logprobs: bool = False,
) -> tuple[Tensor, Tensor, Tensor] | tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Sample ``group_size`` completions for each prompt with ``model.generate``.

    Returns ``(prompt_ids [N, S], prompt_mask [N, S], completion_ids [N, T])`` with
    ``N = len(prompts) * group_size``, prompts left-padded and repeated in place; ``with_logprobs``:
    also the sampled tokens' log-probabilities ``[N, T]`` (:class:`SampledTokenLogprobs`).

    ``sampling.beam_search``: each prompt goes to ``generate`` once, and its group is the
    ``group_size`` best beams, best first, in the same rows; they are not sampled, so there are no
    sampling log-probabilities (``None``).
    """
    device = next(model.parameters()).device
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    copies = 1 if sampling.beam_search else group_size  # beam search expands each prompt into its beams itself
    prompt_ids = encoded["input_ids"].to(device).repeat_interleave(copies, dim=0)
    prompt_mask = encoded["attention_mask"].to(device).repeat_interleave(copies, dim=0)
    completion_ids, logprobs = generate_from_ids(model, tokenizer, prompt_ids, prompt_mask, sampling, group_size,
                                                 with_logprobs)  # fmt: skip
    if sampling.beam_search:  # [P * G] beams, prompt-major: rows g*G .. g*G + G - 1 are prompt g's
        prompt_ids = prompt_ids.repeat_interleave(group_size, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(group_size, dim=0)
    if not with_logprobs:
        return prompt_ids, prompt_mask, completion_ids
    return prompt_ids, prompt_mask, completion_ids, logprobs


@torch.no_grad()
def generate_from_ids(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    sampling: SamplingParams,
    group_size: int = 1,
    with_logprobs: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``(completion_ids [N, T], logprobs [N, T] or None)``: one completion per row of the left-padded
    ``prompt_ids`` ``[N, S]`` (under beam search, ``group_size`` beams per row), continuing exactly
    these token ids; ``with_logprobs``: the sampled tokens' log-probabilities (:class:`SampledTokenLogprobs`)."""
    recorder = SampledTokenLogprobs(sampling.temperature) if with_logprobs and not sampling.beam_search else None
    was_training = model.training
    model.eval()
    try:
        with sampling_as_configured(model):
            sequences = model.generate(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                generation_config=sampling.generation_config(tokenizer, group_size),
                logits_processor=LogitsProcessorList([recorder] if recorder else []),
            )
    finally:
        model.train(was_training)
    completion_ids = sequences[:, prompt_ids.size(1) :]
    return completion_ids, recorder.logprobs(completion_ids) if recorder else None
