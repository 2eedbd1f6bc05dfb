"""reasoning-gym's own scoring of its procedural tasks (``pip install 'grpo-lightning[reasoning]'``).

A row of :class:`grpo_lightning.data.ReasoningGymDataModule` carries what the task's scorer needs:
``task`` (its name), ``task_config`` (its options, JSON) and ``entry`` (the generated problem with its
metadata, JSON); :func:`reasoning_gym_reward` rebuilds the task and calls its ``score_answer``.
"""

from __future__ import annotations

import functools
import json
import re
from types import ModuleType
from typing import Any

from grpo_lightning.errors import ConfigError
from grpo_lightning.rewards.scoring import completion_text

#: The key that marks a tuple in an entry's JSON: scorers compare metadata such as grids as tuples.
TUPLE_KEY = "__tuple__"


def import_reasoning_gym() -> ModuleType:
    """The ``reasoning_gym`` package, or a :class:`ConfigError` saying how to install it."""
    try:
        import reasoning_gym
    except ImportError as error:
        raise ConfigError(
            f"reasoning-gym is not installed ({error}); pip install 'grpo-lightning[reasoning]'."
        ) from None
    return reasoning_gym


def entry_to_json(entry: dict[str, Any]) -> str:
    """``entry`` as JSON text that :func:`entry_from_json` reads back equal, tuples included."""
    return json.dumps(_tag_tuples(entry))


def entry_from_json(text: str) -> dict[str, Any]:
    """The entry that :func:`entry_to_json` wrote."""
    return json.loads(text, object_hook=lambda value: tuple(value[TUPLE_KEY]) if set(value) == {TUPLE_KEY} else value)


def _tag_tuples(value: Any) -> Any:
    if isinstance(value, tuple):
        return {TUPLE_KEY: [_tag_tuples(item) for item in value]}
    if isinstance(value, list):
        return [_tag_tuples(item) for item in value]
    if isinstance(value, dict):
        return {key: _tag_tuples(item) for key, item in value.items()}
    return value


@functools.lru_cache(maxsize=16)
def task_scorer(task: str, task_config: str) -> Any:
    """The reasoning-gym dataset of ``task`` with the options ``task_config`` (JSON): some scorers
    read their task's options (tolerances, board formats), so scoring uses the ones that generated it."""
    return import_reasoning_gym().create_dataset(task, **json.loads(task_config))


#: What is scored of a completion without ``<answer>`` tags (``data.untagged_answer``).
UNTAGGED_ANSWERS = ("whole", "last_number")
#: A number as written in an answer: a sign, digits with thousands separators, decimals.
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def answer_of(completion: Any, untagged: str = "whole") -> str:
    """What reasoning-gym scores: the last ``<answer>...</answer>`` of the completion (its own
    extraction); without tags, the whole completion stripped (``"whole"``, reasoning-gym's rule) or
    its last number without thousands separators (``"last_number"``; the whole text if it has none)."""
    text = completion_text(completion)
    tagged = import_reasoning_gym().utils.extract_answer(text)
    if tagged is not None:
        return tagged
    numbers = NUMBER.findall(text) if untagged == "last_number" else []
    return numbers[-1].replace(",", "") if numbers else text.strip()


def reasoning_gym_reward(
    prompts: list[Any], completions: list[Any], entry: list[str | None], task: list[str], task_config: list[str],
    untagged_answer: list[str] | None = None, **kwargs: Any,
) -> list[float | None]:
    """The task's ``score_answer`` of each completion's answer (:func:`answer_of`, with the row's
    ``untagged_answer``), in ``[0, 1]`` (some tasks give partial credit: 0.01 for a wrong answer,
    a share for a close one); ``None`` for a row without an ``entry``."""
    if not len(entry) == len(task) == len(task_config) == len(completions):
        raise ValueError(
            f"got {len(entry)} entries, {len(task)} tasks and {len(task_config)} task configs for "
            f"{len(completions)} completions; pass one of each per completion."
        )
    return [
        None if row is None else float(task_scorer(name, config).score_answer(answer_of(completion, untagged), entry_from_json(row)))
        for completion, row, name, config, untagged in zip(
            completions, entry, task, task_config, untagged_answer or ["whole"] * len(completions)
        )
    ]


def reasoning_gym_correct(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
    """1.0 where the task's scorer gives full marks (:func:`reasoning_gym_reward` at least 1), else
    0.0: exact correctness, without the partial credit, for ``val/accuracy``, pass@k and maj@n."""
    scores = reasoning_gym_reward(prompts, completions, **columns)
    return [None if score is None else float(score >= 1.0) for score in scores]
