"""GRPO with process supervision (Shao et al. 2024, DeepSeekMath, section 4.1.3).

A step reward function scores each reasoning step of a completion instead of the whole of it.
With ``R`` every step reward of every completion of one prompt, each is normalised within the
group, ``r~ = (r - mean(R)) / std(R)``, and a token's advantage is the sum of the normalised
rewards of the steps that end at or after it: ``A_t = sum_{j: end(j) >= t} r~_j``.

A step reward function is ``(prompts, completions, **columns) -> list`` with, per completion,
either a list of floats, one per step of the completion split at ``step_delimiter`` (a step ends
with its delimiter), or a list of ``(end_token_index, score)`` pairs; ``None`` or an empty list:
no step (the completion's tokens get no advantage). Functions that take a ``token_ends`` keyword
get, per completion, the end character offset of each completion token in the decoded text; those
that take ``completion_ids`` or ``trainer_state`` get them as outcome reward functions do
(:mod:`grpo_lightning.rewards.scoring`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from grpo_lightning.rewards.process import delimited_step_ends, token_at
from grpo_lightning.rewards.scoring import accepts_keyword, check_column_names, passed_keywords

#: Added to the std of a group's step rewards, as in the outcome advantages.
EPS = 1e-4


def token_char_ends(tokenizer: PreTrainedTokenizerBase, completion_ids: Tensor, lengths: Tensor) -> list[list[int]]:
    """Per completion, the length of the decoded text up to and including each of its tokens
    (``lengths[i]`` tokens), decoded as the rollout decodes (special tokens skipped)."""
    ends = []
    for ids, length in zip(completion_ids.tolist(), lengths.tolist()):
        prefixes = [ids[: t + 1] for t in range(int(length))]
        ends.append([len(text) for text in tokenizer.batch_decode(prefixes, skip_special_tokens=True)])
    return ends


def step_rewards(
    function: Callable[..., list],
    name: str,
    prompts: list[Any],
    completions: list[str],
    columns: dict[str, list],
    char_ends: list[list[int]],
    delimiter: str,
    completion_ids: list[list[int]] | None = None,
    trainer_state: Any = None,
) -> list[list[tuple[int, float]]]:
    """``(end_token_index, score)`` pairs of each completion from ``function`` (see the module
    docstring), checked: one entry per completion, as many floats as delimited steps, indices in range."""
    check_column_names(columns)
    extra = {"token_ends": char_ends} if accepts_keyword(function, "token_ends") else {}
    extra.update(passed_keywords(function, completion_ids, trainer_state))
    scored = function(prompts, completions, **columns, **extra)
    if not isinstance(scored, Sequence) or len(scored) != len(completions):
        got = len(scored) if isinstance(scored, Sequence) else type(scored).__name__
        raise ValueError(f"step reward function {name} returned {got} results for {len(completions)} completions; "
                         "return one list of step scores (or (end_token_index, score) pairs) per completion.")  # fmt: skip
    pairs = []
    for row, (steps, text, ends) in enumerate(zip(scored, completions, char_ends)):
        steps = list(steps or [])
        if steps and not isinstance(steps[0], (tuple, list)):
            step_ends = delimited_step_ends(text, delimiter)
            if len(step_ends) != len(steps):
                raise ValueError(
                    f"step reward function {name} gave {len(steps)} scores for completion {row}, which has "
                    f"{len(step_ends)} steps split at step_delimiter={delimiter!r}; return one score per step, "
                    "or (end_token_index, score) pairs."
                )
            steps = [(token_at(ends, end), score) for end, score in zip(step_ends, steps)]
        for index, score in steps:
            if not 0 <= int(index) < max(len(ends), 1):
                raise ValueError(f"step reward function {name}: end_token_index {index} of completion {row} is "
                                 f"outside its {len(ends)} tokens.")  # fmt: skip
            if not math.isfinite(float(score)):
                raise ValueError(f"step reward function {name} scored a step of completion {row} {score}; "
                                 "return finite numbers.")  # fmt: skip
        pairs.append([(int(index), float(score)) for index, score in steps])
    return pairs


def step_advantages(pairs: list[list[tuple[int, float]]], group_size: int, lengths: Tensor, width: int) -> Tensor:
    """Per-token advantages ``[N, width]`` from each completion's ``(end_token_index, score)`` steps:
    step rewards normalised over the group's steps (unbiased std, as the outcome advantages; a group
    whose steps are all equal, or that has fewer than two, gets 0), then summed over the steps ending
    at or after each token. The last step of a completion reaches its last token (its EOS)."""
    placed = torch.zeros(len(pairs), width, dtype=torch.float64)
    for start in range(0, len(pairs), group_size):
        group = pairs[start : start + group_size]
        scores = torch.tensor([score for steps in group for _, score in steps], dtype=torch.float64)
        if scores.numel() < 2 or bool((scores == scores[0]).all()):
            continue
        normalised = iter(((scores - scores.mean()) / (scores.std() + EPS)).tolist())
        for row, steps in enumerate(group, start):
            last = int(lengths[row]) - 1
            latest = max((index for index, _ in steps), default=-1)
            for index, _ in steps:
                placed[row, last if index == latest else index] += next(normalised)
    return placed.flip(1).cumsum(1).flip(1).float()

