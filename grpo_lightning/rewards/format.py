"""Format reward for the DeepSeek-R1 layout ``<think>...</think> <answer>...</answer>``."""

from __future__ import annotations

import re
from typing import Any

from grpo_lightning.rewards.scoring import completion_text

# Reasoning, optional whitespace, then the answer, with nothing else around them but trailing
# whitespace; neither section may contain its own tags again.
R1_FORMAT = re.compile(
    r"<think>(?:(?!</?think>).)*</think>\s*<answer>(?:(?!</?answer>).)*</answer>\s*",
    re.DOTALL,
)


def r1_format_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 when the whole completion is ``<think>...</think>`` then ``<answer>...</answer>``, else 0.0."""
    return [1.0 if R1_FORMAT.fullmatch(completion_text(completion)) else 0.0 for completion in completions]
