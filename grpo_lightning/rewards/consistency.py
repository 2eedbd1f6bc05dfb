"""Self-consistency: the answers of a prompt's completions vote (Wang et al. 2023), with no ground truth.

The same vote gives ``maj@n`` in evaluation (:mod:`grpo_lightning.evaluation.sample_metrics`) and the label-free
reward :func:`majority_vote_reward`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from grpo_lightning.rewards.accuracy import extract_answer, numbers_match, parse_number
from grpo_lightning.rewards.scoring import completion_text

#: Reward of a completion that agrees with its group's most common answer, and of every other one.
AGREES, DISAGREES = 1.0, -0.1


def vote(completion: object) -> Hashable | None:
    """The answer a completion votes for: its extracted answer, as a number when it is one (so
    ``0.50`` and ``.5`` agree), else as lower-case text; ``None`` without an answer."""
    answer = extract_answer(completion_text(completion))
    if answer is None:
        return None
    number = parse_number(answer)
    return number if number is not None else " ".join(answer.lower().split())


def majority_answer(votes: Sequence[Hashable | None]) -> Hashable | None:
    """The most common answer among ``votes``; ``None`` never votes, ties go to the answer seen first;
    ``None`` when nobody voted. Numbers that match as the answers are scored
    (:func:`~grpo_lightning.rewards.accuracy.numbers_match`) are one answer, the first seen:
    ``1/3`` and ``0.3333333``, which both score as correct against ``1/3``, do not split their votes."""
    counts: dict[Hashable, int] = {}
    for answer in votes:
        if answer is None:
            continue
        if answer not in counts:
            answer = next((seen for seen in counts if same_answer(seen, answer)), answer)
        counts[answer] = counts.get(answer, 0) + 1
    return max(counts, key=counts.__getitem__) if counts else None  # max keeps the first of equals


def same_answer(first: Hashable | None, second: Hashable | None) -> bool:
    """Whether two votes are one answer: equal, or numbers that match as answers are scored
    (:func:`~grpo_lightning.rewards.accuracy.numbers_match`)."""
    if first is None or second is None:
        return False
    if isinstance(first, float) and isinstance(second, float):
        return numbers_match(first, second)
    return first == second


def majority_vote_reward(
    prompts: list[Any], completions: list[Any], group_index: Sequence[int] | None = None, **kwargs: Any
) -> list[float]:
    """``1.0`` when a completion's answer is its group's most common answer, else ``-0.1`` (a
    completion without an answer included). ``group_index[i]`` is the group (prompt) of completion
    ``i``, which the scoring passes to every reward function that takes it."""
    if group_index is None:
        raise ValueError(
            "majority_vote_reward needs group_index, the group of each completion: score it with "
            "score_completions(..., group_index=...) or pass group_index=[0, 0, 1, 1, ...] yourself."
        )
    if len(group_index) != len(completions):
        raise ValueError(
            f"got {len(group_index)} group indices for {len(completions)} completions; pass one group_index "
            "per completion."
        )
    votes = [vote(completion) for completion in completions]
    members: dict[int, list[Hashable | None]] = {}
    for group, answer in zip(group_index, votes):
        members.setdefault(group, []).append(answer)
    winners = {group: majority_answer(answers) for group, answers in members.items()}
    return [
        AGREES if same_answer(answer, winners[group]) else DISAGREES
        for group, answer in zip(group_index, votes)
    ]
