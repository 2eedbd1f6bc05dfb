"""reasoning_gym_reward: reasoning-gym's own answer extraction and score_answer, on hand-made completions."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

reasoning_gym = pytest.importorskip("reasoning_gym", reason="needs the reasoning extra (pip install 'grpo-lightning[reasoning]')")

from grpo_lightning.rewards import reasoning_gym_correct, reasoning_gym_reward  # noqa: E402
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


def test_without_tags_last_number_scores_the_completions_last_number():
    given = columns("chain_sum", 3)
    first, second, third = given["answers"]
    completions = [f"The answer is {first}.", f"{int(second) + 7} minus 7 is {second}", f"<answer>{third}</answer> not 5"]
    rows = {key: given[key] for key in ("entry", "task", "task_config")}
    last = reasoning_gym_reward(["?"] * 3, completions, **rows, untagged_answer=["last_number"] * 3)
    assert last == [1.0, 1.0, 1.0]
    assert score(completions, given)[0] < 1.0  # reasoning-gym's rule scores the whole text


def test_last_number_drops_thousands_separators_and_keeps_the_sign_and_decimals():
    from grpo_lightning.rewards.reasoning_gym import answer_of

    assert answer_of("so 12 + 1,234 = 1,246.", "last_number") == "1246"
    assert answer_of("it is -3.5 degrees", "last_number") == "-3.5"
    assert answer_of("no digits here ", "last_number") == "no digits here"
    assert answer_of("x = 4 <answer> 5 </answer>", "last_number") == "5"


def test_correct_is_full_marks_only():
    """gcd gives partial credit to an answer that contains the right one ("3.0" for 3: len 1/3);
    correctness does not."""
    given = columns("gcd", 2)
    rows = {key: given[key] for key in ("entry", "task", "task_config")}
    completions = [f"<answer>{given['answers'][0]}</answer>", f"<answer>{given['answers'][1]}.0</answer>"]
    partial = reasoning_gym_reward(["?"] * 2, completions, **rows)
    assert partial == [1.0, pytest.approx(len(given["answers"][1]) / (len(given["answers"][1]) + 2))]
    assert reasoning_gym_correct(["?"] * 2, completions, **rows) == [1.0, 0.0]
    assert reasoning_gym_correct(["?"], ["1"], **{**{k: v[:1] for k, v in rows.items()}, "entry": [None]}) == [None]
