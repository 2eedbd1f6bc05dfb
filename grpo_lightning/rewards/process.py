"""Step rewards for process supervision (:mod:`grpo_lightning.rewards.process_supervision`): where steps end
in a text and in its tokens, a rule-based scorer for answers checked digit by digit, and a process
reward model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from grpo_lightning.rewards.accuracy import ANSWER_TAG, answers_match
from grpo_lightning.rewards.scoring import completion_text


def token_at(char_ends: Sequence[int], char_end: int) -> int:
    """Index of the first token whose text ends at or after character ``char_end`` (the last token
    when the text is shorter)."""
    for index, end in enumerate(char_ends):
        if end >= char_end:
            return index
    return len(char_ends) - 1


def delimited_step_ends(text: str, delimiter: str) -> list[int]:
    """End character offsets of the steps of ``text`` split at ``delimiter`` (each step ends after
    its delimiter; the last one at the end of the text). Empty trailing steps are dropped."""
    ends, start = [], 0
    while (found := text.find(delimiter, start)) != -1:
        start = found + len(delimiter)
        ends.append(start)
    if start < len(text):
        ends.append(len(text))
    return ends


def answer_prefix_steps(
    prompts: list[Any], completions: list[Any], answer: list[Any], token_ends: list[list[int]], **kwargs: Any
) -> list[list[tuple[int, float]]]:
    """A rule-based step scorer for short exact answers (the built-in arithmetic task): each
    character of the answer inside the last ``<answer>...</answer>`` is a step, scored 1.0 while the answer so
    far is a prefix of the reference and 0.0 from the first wrong character on; a last step at the
    end scores the whole answer (1.0 when it matches). Without an answer tag: one step, 0.0."""
    scored = []
    for completion, reference, ends in zip(completions, answer, token_ends):
        text, reference = completion_text(completion), "" if reference is None else str(reference)
        last = max(len(ends) - 1, 0)
        tagged = next(reversed(list(ANSWER_TAG.finditer(text))), None)  # the last, as accuracy_reward reads it
        if tagged is None:
            scored.append([(last, 0.0)])
            continue
        steps, right = [], True
        for offset, character in enumerate(tagged.group(1)):
            right = right and offset < len(reference) and reference[offset] == character
            steps.append((token_at(ends, tagged.start(1) + offset + 1), 1.0 if right else 0.0))
        steps.append((last, 1.0 if answers_match(tagged.group(1).strip(), reference) else 0.0))
        scored.append(steps)
    return scored


class ProcessRewardModel:
    """Scores each step of ``prompt + completion`` with a token-classification model: the
    probability of label ``positive_label`` (softmax over the labels; sigmoid of the one logit of a
    one-label head) at the last token of each step, steps split at ``step_delimiter``.

    Nothing is loaded until the first call. Returns, per completion, one score per step (the form
    :func:`grpo_lightning.rewards.process_supervision.step_rewards` maps to tokens with the same delimiter).

    Args:
        path: Local directory or hub name of the model (``AutoModelForTokenClassification``) and its tokenizer.
        step_delimiter: What ends a step; must match the variant's ``step_delimiter``.
        positive_label: Index of the "step is correct" label.
        device: Torch device; ``None`` picks CUDA when available, else the CPU.
    """

    def __init__(self, path: str, step_delimiter: str = "\n\n", positive_label: int = 1, device: str | None = None) -> None:
        if not step_delimiter:
            raise ValueError("ProcessRewardModel step_delimiter: give a non-empty string, e.g. '\\n\\n'.")
        self.path, self.step_delimiter, self.positive_label = path, step_delimiter, positive_label
        self.device = device
        self.__name__ = "process_reward_model"
        self.model: Any = None
        self.tokenizer: Any = None

    def _load(self) -> None:
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        model = AutoModelForTokenClassification.from_pretrained(self.path)
        labels = model.config.num_labels
        if labels > 1 and not 0 <= self.positive_label < labels:
            raise ValueError(f"ProcessRewardModel positive_label={self.positive_label}: the model at {self.path!r} "
                             f"has {labels} labels; give one of 0..{labels - 1}.")  # fmt: skip
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = model.to(device).eval()

    @torch.no_grad()
    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[list[float]]:
        if self.model is None:
            self._load()
        scores = []
        for prompt, completion in zip(prompts, completions):
            prompt_text, text = completion_text(prompt), completion_text(completion)
            encoded = self.tokenizer(prompt_text + text, return_offsets_mapping=True, return_tensors="pt")
            offsets = encoded.pop("offset_mapping")[0, :, 1].tolist()
            logits = self.model(**{k: v.to(self.model.device) for k, v in encoded.items()}).logits[0].float()
            probs = logits.sigmoid()[:, 0] if logits.size(-1) == 1 else logits.softmax(-1)[:, self.positive_label]
            steps = [len(prompt_text) + end for end in delimited_step_ends(text, self.step_delimiter)]
            scores.append([float(probs[token_at(offsets, end)]) for end in steps])
        return scores
