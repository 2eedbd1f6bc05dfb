"""Rewards for the DeepSeek-R1 layout ``<think>...</think> <answer>...</answer>``: its format, and
the length of its reasoning."""

from __future__ import annotations

import re
from typing import Any

from grpo_lightning.rewards.scoring import completion_text

# Reasoning, optional whitespace, then the answer, with nothing else around them but trailing
# whitespace; neither section may contain its own tags again.
R1_FORMAT = re.compile(
    r"<think>(?P<think>(?:(?!</?think>).)*)</think>\s*<answer>(?:(?!</?answer>).)*</answer>\s*",
    re.DOTALL,
)
#: Characters of reasoning worth the full length reward.
FULL_REASONING_CHARS = 1000


def r1_format_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 when the whole completion is ``<think>...</think>`` then ``<answer>...</answer>``, else 0.0."""
    return [1.0 if R1_FORMAT.fullmatch(completion_text(completion)) else 0.0 for completion in completions]


def reasoning_length_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """``min(len(think) / 1000, 1)`` for the text ``think`` inside ``<think>...</think>`` of a completion
    in the R1 format (as :func:`r1_format_reward` checks it), else 0.0."""
    scores = []
    for completion in completions:
        match = R1_FORMAT.fullmatch(completion_text(completion))
        scores.append(min(len(match["think"]) / FULL_REASONING_CHARS, 1.0) if match else 0.0)
    return scores
