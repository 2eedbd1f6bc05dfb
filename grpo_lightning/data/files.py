"""Data files on disk: which readers take which files, the files of a folder named by split, and reading one with clear errors."""

from __future__ import annotations

import os

from datasets import Dataset, load_dataset

from grpo_lightning.data.checks import check_text_file
from grpo_lightning.errors import ConfigError

FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}

#: File stems of a folder's data files, by the split each holds.
SPLIT_STEMS = {"train": ("train",), "validation": ("validation", "valid", "val", "dev"), "test": ("test",)}


def split_files(folder: str) -> dict[str, str]:
    """``{split: file}`` for the data files of ``folder`` named by split (``train.jsonl``, ...)."""
    found = {}
    for name in sorted(os.listdir(folder)):
        stem, extension = os.path.splitext(name)
        if extension.lower() not in FILE_BUILDERS:
            continue
        for split, stems in SPLIT_STEMS.items():
            if stem.lower() in stems and split not in found:
                found[split] = os.path.join(folder, name)
    return found


def looks_local(path: str) -> bool:
    """A path a user means as a local file or folder: a data-file extension, an explicit start
    (``/``, ``./``, ``../``, ``~``) or more than one ``/`` (a hub id is ``owner/name``)."""
    return (
        os.path.splitext(path)[1].lower() in FILE_BUILDERS
        or path.startswith(("/", "./", "../", "~"))
        or path.count("/") > 1
        or os.sep != "/" and os.sep in path
    )


def load_file(path: str, field: str) -> Dataset:
    """One data file as a ``Dataset``, with a clear error for an unsupported or empty file, bytes
    that are not UTF-8 and lines that are not JSON objects (:func:`~grpo_lightning.data.checks.check_text_file`),
    and any other error of the reader naming the file."""
    extension = os.path.splitext(path)[1].lower()
    if extension not in FILE_BUILDERS:
        raise ConfigError(
            f"{field}={path!r} has an unsupported extension {extension!r}; "
            f"use one of {sorted(FILE_BUILDERS)} or a directory written by save_to_disk."
        )
    if extension in (".json", ".jsonl", ".csv"):
        check_text_file(path, field)
    try:
        return load_dataset(FILE_BUILDERS[extension], data_files={"rows": path})["rows"]
    except Exception as error:
        cause: BaseException = error
        for _ in range(20):  # the reader's own error, under the wrappers of datasets
            if (cause.__cause__ or cause.__context__) is None:
                break
            cause = cause.__cause__ or cause.__context__
        reason = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        raise ConfigError(
            f"{field}={path!r} could not be read as {FILE_BUILDERS[extension]} ({type(cause).__name__}: {reason}); "
            "fix the file, or give the rows as JSON lines (one JSON object per line)."
        ) from error
