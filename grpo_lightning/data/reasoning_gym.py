"""reasoning-gym's procedural tasks as prompts (``pip install 'grpo-lightning[reasoning]'``), generated
offline from a seed, each row carrying what the task's scorer needs
(:func:`grpo_lightning.rewards.reasoning_gym_reward`)."""

from __future__ import annotations

import difflib
import json
from typing import Any

from datasets import Dataset, DatasetDict
from lightning.pytorch.utilities import rank_zero_warn

from grpo_lightning.data.datamodule import PromptDataModule, require_at_least
from grpo_lightning.errors import ConfigError
from grpo_lightning.rewards.reasoning_gym import (
    UNTAGGED_ANSWERS,
    entry_to_json,
    import_reasoning_gym,
    reasoning_gym_correct,
    reasoning_gym_reward,
)
from grpo_lightning.runtime.argument_types import check_argument_types

#: reasoning-gym seeds problem ``i`` from ``seed + i``: validation starts this far from training's seed.
VALIDATION_SEED_OFFSET = 2**31
#: Validation problems tried per one wanted, as some repeat training prompts (and are skipped).
TRIES_PER_VALIDATION_PROBLEM = 8


def create_task(task: str, task_config: dict[str, Any], seed: int, size: int) -> Any:
    """reasoning-gym's dataset of ``task``, or a :class:`ConfigError` naming the field to fix."""
    reasoning_gym = import_reasoning_gym()
    tasks = reasoning_gym.factory.DATASETS
    if task not in tasks:
        close = difflib.get_close_matches(task, tasks, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"e.g. {', '.join(sorted(tasks)[:3])}"
        raise ConfigError(f"data.task={task!r} is not a reasoning-gym task; {hint} (all {len(tasks)}: "
                          "reasoning_gym.factory.DATASETS).")  # fmt: skip
    try:
        return reasoning_gym.create_dataset(task, seed=seed, size=size, **task_config)
    except (TypeError, ValueError, AssertionError) as error:
        fields = sorted(tasks[task][1].__dataclass_fields__)
        raise ConfigError(f"data.task_config={task_config!r} is not accepted by task {task!r} ({error}); its "
                          f"fields: {', '.join(fields)}.") from None  # fmt: skip


def format_prompt(question: str, chat: bool, system_prompt: str | None) -> str | list[dict[str, str]]:
    """The prompt of ``question``: chat messages (the system prompt, then the question), or plain
    text (the system prompt, a blank line, the question). ``system_prompt`` is the name of one of
    reasoning-gym's (``reasoning_gym.utils.SYSTEM_PROMPTS``), other text as it is, or ``None``."""
    system = import_reasoning_gym().utils.SYSTEM_PROMPTS.get(system_prompt, system_prompt) if system_prompt else None
    if chat:
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return f"{system}\n\n{question}" if system else question


def make_reasoning_gym_dataset(
    task: str,
    task_config: dict[str, Any] | None = None,
    num_train: int = 2000,
    num_val: int = 200,
    seed: int = 0,
    chat: bool = True,
    system_prompt: str | None = "default",
    untagged_answer: str = "whole",
) -> DatasetDict:
    """``train``/``validation`` splits of ``task``'s problems with columns ``prompt``, ``answer``
    (reasoning-gym's reference), ``entry`` (the problem and its metadata, JSON), ``task``,
    ``task_config`` (JSON) and ``untagged_answer`` (what the scorer reads of an answer without
    ``<answer>`` tags, :func:`grpo_lightning.rewards.reasoning_gym.answer_of`). No validation prompt is a training prompt; the result depends only on
    the arguments."""
    config = dict(task_config or {})
    train = list(create_task(task, config, seed, num_train))
    validation = _unseen_problems(task, config, seed + VALIDATION_SEED_OFFSET, num_val, {e["question"] for e in train})

    def rows(entries: list[dict[str, Any]]) -> Dataset:
        return Dataset.from_dict({
            "prompt": [format_prompt(e["question"], chat, system_prompt) for e in entries],
            "answer": [None if e["answer"] is None else str(e["answer"]) for e in entries],
            "entry": [_entry_json(task, e) for e in entries],
            "task": [task] * len(entries),
            "task_config": [json.dumps(config, sort_keys=True)] * len(entries),
            "untagged_answer": [untagged_answer] * len(entries),
        })  # fmt: skip

    return DatasetDict({"train": rows(train), "validation": rows(validation)})


def _unseen_problems(task: str, config: dict[str, Any], seed: int, count: int, seen: set[str]) -> list[dict[str, Any]]:
    """``count`` problems of ``task`` from ``seed`` whose questions are not in ``seen`` nor repeated."""
    tries = count * TRIES_PER_VALIDATION_PROBLEM
    dataset, chosen, seen = create_task(task, config, seed, max(tries, 1)), [], set(seen)
    for index in range(tries):
        if len(chosen) == count:
            break
        entry = dataset[index]
        if entry["question"] not in seen:
            seen.add(entry["question"])
            chosen.append(entry)
    if len(chosen) < count:
        raise ConfigError(
            f"data.num_val={count}: task {task!r} gave only {len(chosen)} problems unlike the training ones in "
            f"{tries} tries; lower --data.num_val or --data.num_train, or widen the task through --data.task_config."
        )
    return chosen


def _entry_json(task: str, entry: dict[str, Any]) -> str:
    try:
        return entry_to_json(entry)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"data.task={task!r}: a problem's metadata cannot be stored as JSON ({error}); "
                          "choose another task or report it to reasoning-gym.") from None  # fmt: skip


class ReasoningGymDataModule(PromptDataModule):
    """Serves a task of `reasoning-gym <https://github.com/open-thought/reasoning-gym>`_, generated
    offline; score it with :func:`grpo_lightning.rewards.reasoning_gym_reward`, as
    ``configs/data/reasoning_gym.yaml`` does for the rewards and ``val/accuracy``.

    Args:
        task: The task's name in reasoning-gym, e.g. ``"chain_sum"`` or ``"basic_arithmetic"``.
        task_config: The task's own options (its config's fields, such as difficulty ranges), passed
            to ``reasoning_gym.create_dataset``.
        num_train: Training problems (reasoning-gym's ``size``).
        num_val: Validation problems, from another seed; none has a training prompt.
        task_seed: reasoning-gym's ``seed`` of the training problems.
        chat: Prompts as chat messages for the tokenizer's chat template; ``False``: plain text.
        system_prompt: One of reasoning-gym's system prompts by name (``"default"`` asks for the
            answer in ``<answer>`` tags; ``"DeepSeekZero"``, ``"simple"``, ``"direct"``,
            ``"chain_of_draft"``), other text as it is, or ``None`` for the question alone.
        untagged_answer: What is scored of a completion without ``<answer>`` tags: ``"whole"`` (the
            completion, reasoning-gym's rule) or ``"last_number"`` (its last number: for a small
            model that answers "The answer is 12." on a numeric task, where format is not the skill).
        **kwargs: Arguments of :class:`PromptDataModule` (batch sizes, shuffle seed, ...).
    """

    def __init__(
        self,
        task: str,
        task_config: dict[str, Any] | None = None,
        num_train: int = 2000,
        num_val: int = 200,
        task_seed: int = 0,
        chat: bool = True,
        system_prompt: str | None = "default",
        untagged_answer: str = "whole",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_argument_types(ReasoningGymDataModule, locals(), field="data.", cli="--data.")
        require_at_least("num_train", num_train, 1)
        require_at_least("num_val", num_val, 0)
        if untagged_answer not in UNTAGGED_ANSWERS:
            raise ConfigError(f"data.untagged_answer={untagged_answer!r}: give one of {', '.join(UNTAGGED_ANSWERS)}.")
        self.task = task
        self.task_config = dict(task_config or {})
        create_task(task, self.task_config, task_seed, num_train)  # a wrong name or option fails here
        warn_unless_reproducible(task, self.task_config, task_seed)
        self.num_train = num_train
        self.num_val = num_val
        self.task_seed = task_seed
        self.chat = chat
        self.system_prompt = system_prompt
        self.untagged_answer = untagged_answer

    def load(self) -> DatasetDict:
        return make_reasoning_gym_dataset(
            self.task, self.task_config, self.num_train, self.num_val, self.task_seed, self.chat, self.system_prompt,
            self.untagged_answer,
        )

    def setup(self, stage: str | None = None) -> None:
        """Load the splits, and say so when the module scores them otherwise than reasoning-gym does."""
        super().setup(stage)
        if self.trainer is not None:
            warn_unless_scored_by_reasoning_gym(self.trainer.lightning_module, self.task)


#: Problems a task generates twice to see that its seed fixes them.
PROBE_SIZE = 4


def warn_unless_reproducible(task: str, config: dict[str, Any], seed: int) -> None:
    """Warn where ``task`` gives other problems for the same seed within this process (a few of
    reasoning-gym's draw from an unseeded source): each run, and each device of a run, then trains
    and validates on other problems. Tasks whose problems follow Python's hash seed repeat here and
    differ between processes; ``PYTHONHASHSEED=0`` fixes those (sweeps set it)."""
    def probe() -> list[str]:
        dataset = create_task(task, config, seed, PROBE_SIZE)
        return [json.dumps([dataset[i]["question"], str(dataset[i]["answer"])]) for i in range(PROBE_SIZE)]

    if probe() != probe():
        rank_zero_warn(f"data.task={task!r} gives other problems each time for the same task_seed, so runs of it (and the "
                       "devices of one run) train and validate on other problems, and reports cannot pair their prompts; "
                       "choose another task for comparisons.")  # fmt: skip


def warn_unless_scored_by_reasoning_gym(module: Any, task: str) -> None:
    """Warn when ``module``'s rewards or ``val/accuracy`` leave out the task's own scorer."""
    scorer = "grpo_lightning.rewards.reasoning_gym_reward"
    fixes, rewards = [], getattr(module, "reward_functions", None)
    if rewards is not None and all(function is not reasoning_gym_reward for _, function in rewards):
        fixes.append(f"--model.rewards.funcs '[{scorer}]'")
    if getattr(module, "accuracy_function", (None, reasoning_gym_reward))[1] not in (reasoning_gym_reward, reasoning_gym_correct):
        fixes.append(f"--model.evaluation.accuracy_func {scorer.replace('reward', 'correct')}")
    if fixes:
        rank_zero_warn(
            f"data: task {task!r} is not scored by its own scorer in {' nor '.join(f.split()[0] for f in fixes)}; "
            f"give {' and '.join(fixes)}, or --config data/reasoning_gym after the variant's file, which sets both."
        )
