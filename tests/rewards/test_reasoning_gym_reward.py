"""reasoning_gym_reward: reasoning-gym's own answer extraction and score_answer, on hand-made completions."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

reasoning_gym = pytest.importorskip("reasoning_gym", reason="needs the reasoning extra (pip install 'grpo-lightning[reasoning]')")

from grpo_lightning.rewards import reasoning_gym_reward  # noqa: E402
from grpo_lightning.rewards.reasoning_gym import entry_from_json, entry_to_json  # noqa: E402


def columns(task: str, count: int, **task_config) -> dict[str, list]:
    """The scorer's columns of ``count`` problems of ``task``, as the data module writes them."""
    entries = list(reasoning_gym.create_dataset(task, seed=0, size=count, **task_config))
    return {"entry": [entry_to_json(e) for e in entries], "task": [task] * count,
            "task_config": [json.dumps(task_config)] * count, "answers": [e["answer"] for e in entries]}  # fmt: skip


def score(completions: list, given: dict[str, list]) -> list:
    return reasoning_gym_reward(["?"] * len(completions), completions, entry=given["entry"], task=given["task"],
                                task_config=given["task_config"])  # fmt: skip


def test_a_correct_answer_scores_one_and_a_wrong_one_zero():
    given = columns("basic_arithmetic", 2)
    right, wrong = given["answers"][0], str(int(given["answers"][1]) + 1000)
    completions = [f"Thinking... <answer>{right}</answer>", f"<answer>{wrong}</answer>"]
    assert score(completions, given) == [1.0, 0.0]


def test_the_last_answer_tag_is_scored_and_without_tags_the_whole_completion():
    given = columns("chain_sum", 3)
    first, second, third = given["answers"]
    completions = [f"<answer>x</answer> then <answer>{first}</answer>", f"  {second}\n", f"{third} is my answer"]
    assert score(completions, given)[:2] == [1.0, 1.0]
    assert score(completions, given)[2] < 1.0


def test_chat_completions_are_scored_by_their_last_message():
    given = columns("chain_sum", 1)
    assert score([[{"role": "assistant", "content": f"<answer>{given['answers'][0]}</answer>"}]], given) == [1.0]


def test_scoring_uses_the_options_the_task_was_generated_with():
    """decimal_arithmetic accepts an error of one unit in its last decimal place: with one place,
    0.05 off is right (with its default three places it would not be)."""
    given = columns("decimal_arithmetic", 1, min_num_decimal_places=1, max_num_decimal_places=1)
    near = Decimal(given["answers"][0]) + Decimal("0.05")
    assert score([f"<answer>{near}</answer>"], given) == [1.0]


def test_a_row_without_an_entry_is_not_scored():
    given = columns("chain_sum", 1)
    assert score(["1"], {**given, "entry": [None]}) == [None]


def test_entries_keep_their_tuples_through_json():
    """arc_agi's scorer compares grids as tuples of tuples: JSON's lists would never equal them."""
    entry = {"answer": "1 2", "metadata": {"output": ((1, 2), (3, 4)), "sizes": [(1,), {"k": (2,)}], "n": None}}
    assert entry_from_json(entry_to_json(entry)) == entry
