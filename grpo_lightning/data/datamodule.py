"""Lightning data modules that serve batches of prompts (and reference columns) for rollouts."""

from __future__ import annotations

import os
from typing import Any

import torch
from datasets import Dataset, DatasetDict, load_dataset, load_from_disk
from lightning import LightningDataModule
from torch.utils.data import DataLoader

from grpo_lightning.data.arithmetic import make_arithmetic_dataset

Batch = dict[str, list[Any]]

FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


class PromptDataModule(LightningDataModule):
    """Serves prompts from a dataset; each batch is a dict of column name -> list of values.

    Every column of the dataset is kept, so reward functions can receive extra columns as keyword
    arguments. The prompt column is also available under ``"prompt"`` and the answer column under
    ``"answer"`` (these aliases win over dataset columns of the same name).

    Args:
        path: A local ``.json``/``.jsonl``/``.csv``/``.parquet`` file (loaded as the ``train_split``
            split), a directory written by ``Dataset.save_to_disk``/``DatasetDict.save_to_disk``,
            or a hub dataset name.
        name: Hub dataset configuration name.
        train_split: Split used for training.
        val_split: Split used for validation; ``None`` disables validation.
        prompt_column: Column holding the prompts (text or a list of chat messages).
        answer_column: Column holding reference answers; ``None`` if rewards need none.
        batch_size: Prompts per rollout; the policy samples a group of completions for each.
        val_batch_size: Prompts per validation batch.
        max_val_samples: Validate on the first this many rows only; ``None`` uses them all.
        seed: Seed of the training shuffle.
        num_workers: Data loader worker processes.
    """

    def __init__(
        self,
        path: str | None = None,
        name: str | None = None,
        train_split: str = "train",
        val_split: str | None = "validation",
        prompt_column: str = "prompt",
        answer_column: str | None = "answer",
        batch_size: int = 8,
        val_batch_size: int = 32,
        max_val_samples: int | None = None,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        _require_at_least("batch_size", batch_size, 1)
        _require_at_least("val_batch_size", val_batch_size, 1)
        _require_at_least("num_workers", num_workers, 0)
        if max_val_samples is not None:
            _require_at_least("max_val_samples", max_val_samples, 1)
        self.path = path
        self.name = name
        self.train_split = train_split
        self.val_split = val_split
        self.prompt_column = prompt_column
        self.answer_column = answer_column
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size
        self.max_val_samples = max_val_samples
        self.seed = seed
        self.num_workers = num_workers
        self.train_dataset: Dataset | None = None
        self.val_dataset: Dataset | None = None
        self._splits: DatasetDict | None = None

    def load(self) -> DatasetDict:
        """Load all splits from ``path``; subclasses may override this to build data in memory."""
        if self.path is None:
            raise ValueError(
                "data.path is not set; set --data.path to a data file, a saved dataset directory "
                "or a hub dataset name."
            )
        if os.path.isdir(self.path):
            loaded = load_from_disk(self.path)
            return loaded if isinstance(loaded, DatasetDict) else DatasetDict({self.train_split: loaded})
        if os.path.isfile(self.path):
            extension = os.path.splitext(self.path)[1].lower()
            if extension not in FILE_BUILDERS:
                raise ValueError(
                    f"data.path={self.path!r} has an unsupported extension {extension!r}; "
                    f"use one of {sorted(FILE_BUILDERS)} or a directory written by save_to_disk."
                )
            return load_dataset(FILE_BUILDERS[extension], data_files={self.train_split: self.path})
        try:
            return load_dataset(self.path, self.name)
        except Exception as error:
            raise ValueError(
                f"data.path={self.path!r} is not an existing file or directory and could not be loaded "
                f"as a hub dataset ({type(error).__name__}: {error}); set --data.path to a local file, "
                "a saved dataset directory or a hub dataset name (with --data.name for its config)."
            ) from error

    def setup(self, stage: str | None = None) -> None:
        """Load and validate the splits needed for ``stage`` (once)."""
        if self._splits is None:
            self._splits = self.load()
        if stage in (None, "fit"):
            self.train_dataset = self._checked_split("train_split", self.train_split)
            if len(self.train_dataset) < self.batch_size:
                raise ValueError(
                    f"data.batch_size={self.batch_size} is larger than the {len(self.train_dataset)} rows of "
                    f"split {self.train_split!r}, so no full training batch exists; "
                    f"set --data.batch_size to at most {len(self.train_dataset)} or add rows."
                )
        if stage in (None, "fit", "validate") and self.val_split is not None:
            val_dataset = self._checked_split("val_split", self.val_split)
            if self.max_val_samples is not None:
                val_dataset = val_dataset.select(range(min(self.max_val_samples, len(val_dataset))))
            self.val_dataset = val_dataset

    def train_dataloader(self) -> DataLoader:
        """Shuffled (seeded by ``seed``) batches of ``batch_size`` prompts; the last partial batch is dropped."""
        if self.train_dataset is None:
            raise RuntimeError("train_dataloader() needs setup('fit') to run first.")
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            self.train_dataset,
            batch_size=self.batch_size,
            shuffle=True,
            generator=generator,
            drop_last=True,
            num_workers=self.num_workers,
            collate_fn=self.collate,
        )

    def val_dataloader(self) -> DataLoader | list:
        """Batches of ``val_batch_size`` prompts in dataset order; an empty list when ``val_split`` is None."""
        if self.val_split is None:
            return []
        if self.val_dataset is None:
            raise RuntimeError("val_dataloader() needs setup('fit') or setup('validate') to run first.")
        return DataLoader(
            self.val_dataset,
            batch_size=self.val_batch_size,
            shuffle=False,
            num_workers=self.num_workers,
            collate_fn=self.collate,
        )

    def collate(self, rows: list[dict[str, Any]]) -> Batch:
        """Turn rows into a dict of column -> list, adding the ``prompt``/``answer`` aliases."""
        batch: Batch = {column: [row[column] for row in rows] for column in rows[0]}
        batch["prompt"] = batch[self.prompt_column]
        if self.answer_column is not None:
            batch["answer"] = batch[self.answer_column]
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.seed = state_dict.get("seed", self.seed)

    def _checked_split(self, field: str, split: str) -> Dataset:
        assert self._splits is not None
        available = list(self._splits.keys())
        if split not in self._splits:
            fix = f"set --data.{field} to one of them"
            if field == "val_split":
                fix += ", or --data.val_split null to train without validation"
            raise ValueError(
                f"data.{field}={split!r} is not a split of the dataset; available splits: {available}; {fix}."
            )
        dataset = self._splits[split]
        if len(dataset) == 0:
            fix = f"set --data.{field} to a split with rows"
            if field == "val_split":
                fix += ", or --data.val_split null to train without validation"
            raise ValueError(f"split {split!r} (data.{field}) has no rows; {fix}.")
        self._check_column("prompt_column", self.prompt_column, dataset, split)
        if self.answer_column is not None:
            self._check_column("answer_column", self.answer_column, dataset, split)
        return dataset

    @staticmethod
    def _check_column(field: str, column: str, dataset: Dataset, split: str) -> None:
        if column in dataset.column_names:
            return
        fix = f"set --data.{field} to one of them"
        if field == "answer_column":
            fix += ", or --data.answer_column null if the rewards need no reference answer"
        raise ValueError(
            f"data.{field}={column!r} is not a column of split {split!r}; "
            f"available columns: {dataset.column_names}; {fix}."
        )


class ArithmeticDataModule(PromptDataModule):
    """Serves the built-in arithmetic task (prompts like ``"37+45="``, answers like ``"82"``).

    Args:
        digits: Operands are uniform in ``[0, 10**digits - 1]``.
        operations: Characters from ``"+-*"``; each problem uses one, drawn uniformly.
        num_train: Training problems.
        num_val: Validation problems (disjoint from the training ones).
        task_seed: Seed that generates the problems.
        **kwargs: Arguments of :class:`PromptDataModule` (batch sizes, shuffle seed, ...).
    """

    def __init__(
        self,
        digits: int = 2,
        operations: str = "+",
        num_train: int = 2000,
        num_val: int = 200,
        task_seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.digits = digits
        self.operations = operations
        self.num_train = num_train
        self.num_val = num_val
        self.task_seed = task_seed

    def load(self) -> DatasetDict:
        return make_arithmetic_dataset(
            num_train=self.num_train,
            num_val=self.num_val,
            digits=self.digits,
            operations=self.operations,
            seed=self.task_seed,
        )


def _require_at_least(field: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise ValueError(f"data.{field}={value} must be at least {minimum}; set --data.{field} to {minimum} or more.")
