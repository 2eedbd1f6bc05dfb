"""How much one answer dominates a validation's completions, beside how much one dominates the references.

A policy that learned to give every prompt the same answer (a constant that a reward rewards often
enough) shows here first: the share of completions whose answer is the most common one is high while
the reference answers' own most common share is low. Logged by validation as ``val/top_answer_share``
and ``val/reference_top_answer_share``; the ``answer_collapse`` health check reads them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from grpo_lightning.rewards.accuracy import parse_number
from grpo_lightning.rewards.consistency import same_answer, vote
from grpo_lightning.rewards.scoring import completion_text

#: A prompt's reference answer and the answers of its completions.
PromptAnswers = tuple[Hashable, list[Hashable]]


def answer_key(completion: Any, voted: Hashable | None = None) -> Hashable:
    """A completion's answer: its extracted answer (:func:`~grpo_lightning.rewards.consistency.vote`:
    numbers compare as numbers; ``voted``, where its vote was already taken), else its whole text with
    the whitespace collapsed."""
    answer = vote(completion) if voted is None else voted
    return answer if answer is not None else " ".join(completion_text(completion).split())


def reference_key(reference: Any) -> Hashable:
    """A reference answer as :func:`answer_key` writes an answer: a number, else lower-case text."""
    number = parse_number(str(reference))
    return number if number is not None else " ".join(str(reference).lower().split())


def prompt_answers(
    references: Sequence[Any], completions: Sequence[Any], samples: int, votes: Sequence[Hashable | None] = ()
) -> list[PromptAnswers]:
    """Per prompt, ``(reference key, [answer key of each of its samples completions])``: ``references``
    and ``completions`` hold one entry per completion, ``samples`` per prompt in a row; ``votes``, each
    completion's :func:`~grpo_lightning.rewards.consistency.vote` where the caller took them already."""
    voted = list(votes) or [None] * len(completions)
    keys = [answer_key(completion, answer) for completion, answer in zip(completions, voted)]
    return [(reference_key(references[start]), keys[start : start + samples]) for start in range(0, len(keys), samples)]


def top_share(values: Sequence[Hashable]) -> float:
    """The share of ``values`` that are the most common answer, numbers grouped as ``maj@n`` groups
    them (:func:`~grpo_lightning.rewards.consistency.same_answer`: ``1/3`` and ``0.3333333`` are one);
    0 for none."""
    if not values:
        return 0.0
    counts = Counter(values)
    numbers = sorted(value for value in counts if isinstance(value, float))
    groups = [counts[value] for value in counts if not isinstance(value, float)]
    anchor = None
    for number in numbers:  # sorted, so numbers within the tolerance of a group's first are next to it
        if anchor is not None and same_answer(anchor, number):
            groups[-1] += counts[number]
        else:
            anchor = number
            groups.append(counts[number])
    return max(groups) / len(values)


def answer_shares(prompts: Sequence[PromptAnswers]) -> dict[str, float]:
    """``top_answer_share`` over every completion of ``prompts`` and ``reference_top_answer_share``
    over their references, each reference counted once per completion so that both are shares of
    the same completions."""
    answers = [answer for _, completed in prompts for answer in completed]
    references = [reference for reference, completed in prompts for _ in completed]
    return {"top_answer_share": top_share(answers), "reference_top_answer_share": top_share(references)}
