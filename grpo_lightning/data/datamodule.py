"""Lightning data modules that serve batches of prompts (and reference columns) for rollouts."""

from __future__ import annotations

import os
import re
from typing import Any, Literal

import torch
from datasets import Dataset, DatasetDict, load_dataset, load_from_disk
from lightning import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader

from grpo_lightning.runtime.argument_types import check_argument_types
from grpo_lightning.data.arithmetic import TERSE_TEMPLATE, check_arithmetic_arguments, make_arithmetic_dataset
from grpo_lightning.data.checks import check_prompts
from grpo_lightning.data.files import FILE_BUILDERS, load_file, looks_local, split_files
from grpo_lightning.data.loaders import ResumableDataLoader, ResumableSampler
from grpo_lightning.errors import ConfigError
from grpo_lightning.rewards.scoring import check_column_names

Batch = dict[str, list[Any]]


def _one_split(splits: DatasetDict, wanted: str, field: str, path: str) -> Dataset:
    """The split of ``path`` (given as ``data.<field>``) named ``wanted``, else its only one. Of several
    others none is taken: the first of them may be the training split."""
    if wanted in splits or len(splits) == 1:
        return splits[wanted] if wanted in splits else next(iter(splits.values()))
    raise ConfigError(
        f"data.{field}={path!r} has the splits {sorted(splits)} and none named {wanted!r}, so which one to use is "
        f"not clear; point data.{field} at that split's own file (e.g. {path}/test.jsonl), or save that split alone "
        "(datasets: load_dataset(...)[SPLIT].to_json('FILE.jsonl')) and point at the file."
    )


def _check_val_set_names(val_sets: dict[str, str]) -> None:
    """Names of ``val_sets`` become metric prefixes (``val/<name>/accuracy``): letters, digits, ``_`` and ``-``."""
    for name in val_sets:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", str(name)):
            raise ConfigError(
                f"data.val_sets: name {name!r} is not usable in metric names; use letters, digits, '_' and '-', "
                "e.g. --data.val_sets '{gsm8k: data/gsm8k.jsonl}'."
            )


class PromptDataModule(LightningDataModule):
    """Serves prompts from a dataset; each batch is a dict of column name -> list of values.

    Every column of the dataset is kept, so reward functions can receive extra columns as keyword
    arguments. The prompt column is also available under ``"prompt"`` and the answer column under
    ``"answer"`` (these aliases win over dataset columns of the same name).

    Args:
        path: A local ``.json``/``.jsonl``/``.csv``/``.parquet`` file (loaded as the ``train_split``
            split), a folder of such files named by split (``train.jsonl``, ``validation.jsonl``,
            ``test.jsonl``), a directory written by ``Dataset.save_to_disk``/``DatasetDict.save_to_disk``,
            or a hub dataset name. Local paths are never looked up on the hub.
        val_path: A separate validation file (or folder: its ``validation`` split, else its only one),
            loaded as the ``val_split`` split.
        test_path: A separate test file (or folder: its ``test`` split, else its only one), loaded as
            the ``test`` split.
        name: Hub dataset configuration name.
        train_split: Split used for training.
        val_split: Split used for validation; ``None`` disables validation; ``"auto"`` takes the
            ``validation`` split (or ``val_path``) where there is one and trains without validation,
            saying so, where there is none.
        test_split: Split that ``grpo-lightning test`` evaluates (``test/*`` metrics).
        prompt_column: Column holding the prompts (text or a list of chat messages).
        answer_column: Column holding reference answers; ``None`` if rewards need none.
        batch_size: Prompts per rollout; the policy samples a group of completions for each.
        val_batch_size: Prompts per validation batch.
        max_val_samples: Validate on the first this many rows only (of each validation set);
            ``None`` uses them all.
        val_sets: Further validation sets, name -> file or folder (its ``validation`` split, else
            its only one; of several others none is guessed), each validated beside the main one and logged under ``val/<name>/``.
        seed: Seed of the training shuffle.
        num_workers: Data loader worker processes.
        long_prompts: A prompt longer than the model's context minus ``max_new_tokens``, found when
            the fit starts: ``"error"`` (name it), ``"truncate"`` (keep its last tokens: the end of
            the question) or ``"skip"`` (drop the row); both warn once per split with the count
            (:func:`grpo_lightning.data.checks.fit_prompts`).

    Rows are checked when loaded: a data file with bytes that are not UTF-8 or a JSON-lines line
    that is not an object (or is nested too deeply to read), and a prompt that is missing, empty, or
    neither text nor chat messages, are errors naming the file and the line or row.
    """

    def __init__(
        self,
        path: str | None = None,
        val_path: str | None = None,
        test_path: str | None = None,
        name: str | None = None,
        train_split: str = "train",
        val_split: str | None = "auto",
        test_split: str = "test",
        prompt_column: str = "prompt",
        answer_column: str | None = "answer",
        batch_size: int = 8,
        val_batch_size: int = 32,
        max_val_samples: int | None = None,
        val_sets: dict[str, str] | None = None,
        seed: int = 0,
        num_workers: int = 0,
        long_prompts: Literal["error", "truncate", "skip"] = "error",
    ) -> None:
        super().__init__()
        paths = (path, val_path, test_path)
        path, val_path, test_path = (os.fspath(p) if isinstance(p, os.PathLike) else p for p in paths)
        check_argument_types(PromptDataModule, locals(), field="data.", cli="--data.")
        require_at_least("batch_size", batch_size, 1)
        require_at_least("val_batch_size", val_batch_size, 1)
        require_at_least("num_workers", num_workers, 0)
        if max_val_samples is not None:
            require_at_least("max_val_samples", max_val_samples, 1)
        self.path = path
        self.val_path = val_path
        self.test_path = test_path
        self.name = name
        self.train_split = train_split
        self.val_split = val_split
        self.test_split = test_split
        self.test_dataset: Dataset | None = None
        self.prompt_column = prompt_column
        self.answer_column = answer_column
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size
        self.max_val_samples = max_val_samples
        self.val_sets = dict(val_sets or {})
        _check_val_set_names(self.val_sets)
        self.extra_val_datasets: dict[str, Dataset] = {}
        self.seed = seed
        self.num_workers = num_workers
        self.long_prompts = long_prompts
        self.train_dataset: Dataset | None = None
        self.val_dataset: Dataset | None = None
        self.curriculum: Any = None  # a DifficultyCurriculum (grpo_lightning.data.curriculum) sets the training sampler
        self._splits: DatasetDict | None = None
        # id -> (dataset, the file it was read from): row errors name the file; holding the dataset
        # keeps its id from being reused by another
        self._files: dict[int, tuple[Dataset, str]] = {}

    def load(self) -> DatasetDict:
        """Load all splits from ``path`` (and the validation split from ``val_path``); subclasses may
        override this to build data in memory."""
        if self.path is None:
            raise ConfigError(
                "data.path is not set; set --data.path to a data file, a saved dataset directory "
                "or a hub dataset name."
            )
        splits = self._load_path(self.path, "path")
        if self.val_path is not None:
            val_splits = self._load_path(self.val_path, "val_path")
            val_split = self.val_split if self.val_split not in (None, "auto") else "validation"
            splits[val_split] = _one_split(val_splits, "validation", "val_path", self.val_path)
        if self.test_path is not None:
            test_splits = self._load_path(self.test_path, "test_path")
            splits[self.test_split] = _one_split(test_splits, "test", "test_path", self.test_path)
        return splits

    def _load_path(self, path: str, field: str) -> DatasetDict:
        """Splits of one ``path``: a data file (as the ``train_split``), a folder of data files named
        by split (``train.jsonl``, ``validation.jsonl``, ``test.jsonl``), a ``save_to_disk`` folder, or a
        hub dataset. A path that looks local is never looked up on the hub."""
        path = os.path.expanduser(path)
        if os.path.isdir(path):
            files = split_files(path)
            if files:
                return DatasetDict({split: self._read(file, f"data.{field}") for split, file in files.items()})
            try:
                loaded = load_from_disk(path)
            except FileNotFoundError as error:
                raise ConfigError(
                    f"data.{field}={path!r} is a folder with neither data files named by split "
                    f"({', '.join(f'train{e}' for e in FILE_BUILDERS)}, validation..., test...) nor a dataset "
                    "written by save_to_disk; put train.jsonl (and validation.jsonl) there or point at a file."
                ) from error
            return loaded if isinstance(loaded, DatasetDict) else DatasetDict({self.train_split: loaded})
        if os.path.isfile(path):
            return DatasetDict({self.train_split: self._read(path, f"data.{field}")})
        if looks_local(path):
            raise ConfigError(
                f"data.{field}={path!r}: no such file or folder (looked in {os.getcwd()}); check the path."
            )
        try:
            return load_dataset(path, self.name)
        except Exception as error:
            raise ConfigError(
                f"data.{field}={path!r} is not an existing file or directory and could not be loaded "
                f"as a hub dataset ({type(error).__name__}: {error}); set --data.{field} to a local file, "
                "a saved dataset directory or a hub dataset name (with --data.name for its config)."
            ) from error

    def _read(self, path: str, field: str) -> Dataset:
        dataset = load_file(path, field)
        self._files[id(dataset)] = (dataset, path)
        return dataset

    def setup(self, stage: str | None = None) -> None:
        """Load and validate the splits needed for ``stage`` (once)."""
        if self._splits is None:
            self._splits = self.load()
            if self.val_split == "auto":
                self.val_split = "validation" if "validation" in self._splits else None
                if self.val_split is None:
                    rank_zero_warn(
                        "data: no validation split, so the fit runs without validation; add validation.jsonl "
                        "beside train.jsonl, give --data.val_path, or name a split with --data.val_split."
                    )
        if stage in (None, "fit"):
            self.train_dataset = self._checked_split("train_split", self.train_split)
            if len(self.train_dataset) < self.batch_size:
                raise ConfigError(
                    f"data.batch_size={self.batch_size} is larger than the {len(self.train_dataset)} rows of "
                    f"split {self.train_split!r}, so no full training batch exists; "
                    f"set --data.batch_size to at most {len(self.train_dataset)} or add rows."
                )
        if stage == "test":
            self.test_dataset = self._checked_split("test_split", self.test_split)
        if stage in (None, "fit", "validate") and self.val_split is not None:
            val_dataset = self._checked_split("val_split", self.val_split)
            self.val_dataset = self._first_rows(val_dataset)
        if stage in (None, "fit", "validate"):
            for name, path in self.val_sets.items():
                dataset = _one_split(self._load_path(path, f"val_sets.{name}"), "validation", f"val_sets.{name}", path)
                self._check_rows(dataset, f"data.val_sets.{name}")
                self.extra_val_datasets[name] = self._first_rows(dataset)

    def _first_rows(self, dataset: Dataset) -> Dataset:
        """The first ``max_val_samples`` rows of a validation set (all when it is ``None``)."""
        if self.max_val_samples is None or self.max_val_samples >= len(dataset):
            return dataset
        rank_zero_info(f"data: validating on the first {self.max_val_samples} of {len(dataset)} rows "
                       "(data.max_val_samples; null for all).")  # fmt: skip
        return dataset.select(range(self.max_val_samples))

    @property
    def val_set_names(self) -> list[str]:
        """Names of the validation loaders, in order: ``""`` for the main one (``val/*``), then
        the ``val_sets`` (``val/<name>/*``)."""
        return ([""] if self.val_split is not None else []) + list(self.val_sets)

    def train_dataloader(self) -> ResumableDataLoader:
        """Shuffled (seeded by ``seed``) batches of ``batch_size`` prompts; the last partial batch is dropped.

        Each device gets its own share of the shuffle. The loader is resumable: checkpoints hold
        the data position, and a fit resumed from one continues the same order.
        """
        if self.train_dataset is None:
            raise RuntimeError("train_dataloader() needs setup('fit') to run first.")
        trainer = self.trainer
        num_replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        placement = {"seed": self.seed, "num_replicas": num_replicas, "rank": rank}
        sampler = (ResumableSampler(self.train_dataset, **placement) if self.curriculum is None
                   else self.curriculum.new_sampler(self.train_dataset, self.batch_size, **placement))  # fmt: skip
        return ResumableDataLoader(
            self.train_dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            drop_last=True,
            num_workers=self.num_workers,
            collate_fn=self.collate,
            # worker seeds come from here, not from the global RNG the rollouts sample from
            generator=torch.Generator().manual_seed(self.seed),
        )

    def test_dataloader(self) -> DataLoader:
        """Batches of ``val_batch_size`` prompts of ``test_split`` in dataset order."""
        if self.test_dataset is None:
            raise RuntimeError("test_dataloader() needs setup('test') to run first.")
        return DataLoader(
            self.test_dataset, batch_size=self.val_batch_size, shuffle=False, num_workers=self.num_workers,
            collate_fn=self.collate,
        )  # fmt: skip

    def val_dataloader(self) -> DataLoader | list:
        """Batches of ``val_batch_size`` prompts in dataset order: one loader, or one per
        validation set (:attr:`val_set_names`) when ``val_sets`` adds some; none when there is none."""
        if self.val_split is not None and self.val_dataset is None:
            raise RuntimeError("val_dataloader() needs setup('fit') or setup('validate') to run first.")
        datasets = ([self.val_dataset] if self.val_split is not None else []) + list(self.extra_val_datasets.values())
        loaders = [
            DataLoader(dataset, batch_size=self.val_batch_size, shuffle=False, num_workers=self.num_workers,
                       collate_fn=self.collate)  # fmt: skip
            for dataset in datasets
        ]
        return loaders[0] if len(loaders) == 1 and not self.val_sets else loaders

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
            if field == "test_split":
                fix += ", or give a test file with --data.test_path (or test.jsonl beside train.jsonl)"
            raise ConfigError(
                f"data.{field}={split!r} is not a split of the dataset; available splits: {available}; {fix}."
            )
        dataset = self._splits[split]
        if len(dataset) == 0:
            fix = f"set --data.{field} to a split with rows"
            if field == "val_split":
                fix += ", or --data.val_split null to train without validation"
            raise ConfigError(f"split {split!r} (data.{field}) has no rows; {fix}.")
        self._check_rows(dataset, f"split {split!r}")
        return dataset

    def _check_rows(self, dataset: Dataset, where: str) -> None:
        """The prompt and answer columns exist, and every prompt is text or chat messages, not empty."""
        read = self._files.get(id(dataset))
        if read is not None and read[0] is dataset:
            where = f"{where} (file {read[1]!r})"
        self._check_column("prompt_column", self.prompt_column, dataset, where)
        check_column_names(dataset.column_names, where)  # names the scoring passes reward functions itself
        if self.answer_column is not None:
            self._check_column("answer_column", self.answer_column, dataset, where)
        check_prompts(dataset[self.prompt_column], self.prompt_column, where)

    @staticmethod
    def _check_column(field: str, column: str, dataset: Dataset, where: str) -> None:
        if column in dataset.column_names:
            return
        fix = f"set --data.{field} to one of them"
        if field == "answer_column":
            fix += ", or --data.answer_column null if the rewards need no reference answer"
        raise ConfigError(
            f"data.{field}={column!r} is not a column of {where}; available columns: {dataset.column_names}; {fix}."
        )


class ArithmeticDataModule(PromptDataModule):
    """Serves the built-in arithmetic task (prompts like ``"37+45="``, answers like ``"82"``).

    Args:
        digits: Operands are uniform in ``[0, 10**digits - 1]``.
        operations: Characters from ``"+-*"``; each problem uses one, drawn uniformly.
        num_train: Training problems.
        num_val: Validation problems (disjoint from the training ones).
        task_seed: Seed that generates the problems.
        template: How a prompt reads, from ``{a}``, ``{op}`` and ``{b}`` (default ``"{a}{op}{b}="``).
        **kwargs: Arguments of :class:`PromptDataModule` (batch sizes, shuffle seed, ...).
    """

    def __init__(
        self,
        digits: int = 2,
        operations: str = "+",
        num_train: int = 2000,
        num_val: int = 200,
        task_seed: int = 0,
        template: str = TERSE_TEMPLATE,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_argument_types(ArithmeticDataModule, locals(), field="data.", cli="--data.")
        check_arithmetic_arguments(num_train, num_val, digits, operations, template)
        self.template = template
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
            template=self.template,
        )


def require_at_least(field: str, value: int, minimum: int) -> None:
    """Raise :class:`ConfigError` naming ``data.<field>`` when ``value`` is below ``minimum``."""
    if value < minimum:
        raise ConfigError(f"data.{field}={value} must be at least {minimum}; set --data.{field} to {minimum} or more.")
