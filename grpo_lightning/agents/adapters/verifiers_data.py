"""The tasks of a verifiers taskset as a data module, so that ``--data`` and ``--model.environment`` name
the same taskset: ``--data.class_path grpo_lightning.agents.adapters.verifiers_data.TasksetDataModule
--data.init_args.taskset my_env.MyTaskset``."""

from __future__ import annotations

from typing import Any

from grpo_lightning.agents.adapters.extras import import_optional_object
from grpo_lightning.agents.adapters.verifiers import build_taskset, follows_verifiers_contract
from grpo_lightning.data.datamodule import PromptDataModule
from grpo_lightning.errors import ConfigError, require


def task_row(task: Any) -> dict[str, str]:
    """One task as a row: ``prompt``, its text (what completion tables show; its name where it has none),
    and ``task``, its data as JSON, from which the environment builds it again."""
    name = task.data.name or f"task {task.data.idx}"
    return {"prompt": task.data.prompt_text or name, "task": task.data.model_dump_json()}


class TasksetDataModule(PromptDataModule):
    """The first ``num_train`` tasks of a verifiers taskset to train on, the ``num_val`` after them to
    validate on (:func:`task_row`).

    Args:
        taskset: import path of the ``vf.Taskset`` subclass, as in ``--model.environment.name``.
        args: its config's fields, as in ``--model.environment.args`` (the adapter's settings there are
            left out here).
        num_train: tasks to train on; ``None``: all but the validation ones (of a finite taskset).
        num_val: tasks to validate on, after the training ones; 0: no validation.
        batch_size, val_batch_size, seed, num_workers: as :class:`~grpo_lightning.data.PromptDataModule`'s.
    """

    def __init__(self, taskset: str, args: dict[str, Any] | None = None, num_train: int | None = None,
                 num_val: int = 0, batch_size: int = 8, val_batch_size: int = 32, seed: int = 0,
                 num_workers: int = 0) -> None:  # fmt: skip
        super().__init__(val_split="validation" if num_val else None, answer_column=None, batch_size=batch_size,
                         val_batch_size=val_batch_size, seed=seed, num_workers=num_workers)  # fmt: skip
        require(num_train is None or num_train >= 1, f"data.num_train: must be at least 1, got {num_train}.")
        require(num_val >= 0, f"data.num_val: must be at least 0, got {num_val}.")
        self.taskset, self.args, self.num_train, self.num_val = taskset, dict(args or {}), num_train, num_val

    def load(self):
        from datasets import Dataset, DatasetDict

        factory = import_optional_object(self.taskset, "data.taskset")
        require(follows_verifiers_contract(factory), f"data.taskset: {self.taskset} is not a subclass of verifiers' Taskset.")
        taskset = build_taskset(factory, self.args, "data.args")
        if self.num_train is None and not taskset.bounded:
            raise ConfigError(f"data.num_train: {self.taskset} yields tasks without end; give how many to train on.")
        tasks = list(taskset if self.num_train is None else taskset.take(self.num_train + self.num_val))
        rows = [task_row(task) for task in tasks]
        split = len(rows) - self.num_val if self.num_train is None else min(self.num_train, len(rows))
        require(split >= 1, f"data: {self.taskset} has {len(rows)} tasks, none left to train on after num_val={self.num_val}.")
        splits = {"train": Dataset.from_list(rows[:split])}
        if self.num_val:
            splits["validation"] = Dataset.from_list(rows[split:])
        return DatasetDict(splits)
