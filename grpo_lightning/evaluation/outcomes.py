"""Each prompt's outcomes in one validation, kept so that arms can be compared prompt by prompt.

Every validation (and test) writes, on rank 0, one gzipped CSV file (``zcat`` reads it) beside
the run's logs: ``<log_dir>/outcomes/<prefix>-step<step>.csv.gz``, ``prefix`` as the metrics'
(``val``, ``test`` or ``evaluation_sampling``'s) and ``step`` the optimizer steps taken, six
digits. One row per completion, in the order of its columns::

    set,prompt,prompt_hash,sample,step,reward,correct
    ,0,3f1c0a9be2d4,0,40,1.0,1.0

``set``: the validation set (empty: the main one; else a name of ``data.val_sets``); ``prompt``:
the prompt's index in its set; ``prompt_hash``: the first 12 hex digits of the SHA-256 of its text
(:func:`prompt_hash`), so that runs validated on a set in another order are told apart;
``sample``: the completion's index among the prompt's ``evaluation.samples``; ``reward``: the
weighted sum of the rewards; ``correct``: the score of ``evaluation.accuracy_func`` (1.0 correct,
``nan`` where it does not apply). ``val/accuracy`` is the mean of ``correct`` over the rows of a
set. A validation again at the same step (a resumed fit) replaces the file.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

OUTCOMES_FOLDER = "outcomes"
OUTCOMES_HEADER = ["set", "prompt", "prompt_hash", "sample", "step", "reward", "correct"]


def prompt_hash(prompt: Any) -> str:
    """12 hex digits of the SHA-256 of a prompt: its text, or a chat prompt's messages as sorted JSON."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def outcomes_path(directory: str | Path, prefix: str, step: int) -> Path:
    """The file of the validation logged under ``prefix`` at optimizer step ``step``."""
    return Path(directory) / OUTCOMES_FOLDER / f"{prefix}-step{step:06d}.csv.gz"


def outcome_rows(set_name: str, prompts: Sequence[int], hashes: Sequence[str], rewards: Sequence[Sequence[float]],
                 correct: Sequence[Sequence[float]], step: int) -> list[list]:  # fmt: skip
    """The rows of ``P`` prompts (their indices and hashes) with ``[P, n]`` rewards and accuracy scores."""
    return [
        [set_name, int(prompt), digest, sample, int(step), float(reward), float(score)]
        for prompt, digest, prompt_rewards, prompt_correct in zip(prompts, hashes, rewards, correct)
        for sample, (reward, score) in enumerate(zip(prompt_rewards, prompt_correct))
    ]


def write_outcomes(rows: Sequence[Sequence], path: Path) -> None:
    """``rows`` sorted by set, prompt and sample; floats as ``repr`` so that they read back the
    same; gzipped without a time stamp, so the bytes depend on the rows alone."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed, \
            io.TextIOWrapper(packed, encoding="utf-8", newline="") as out:  # fmt: skip
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(OUTCOMES_HEADER)
        for row in sorted(rows, key=lambda r: (r[0], r[1], r[3])):
            writer.writerow([*row[:5], repr(float(row[5])), repr(float(row[6]))])


@dataclass(frozen=True)
class PromptOutcomes:
    """One validation set's outcomes in one validation, by prompt: ``prompt`` ``[P]`` (indices,
    ascending), ``prompt_hash`` ``[P]``, ``reward`` and ``correct`` ``[P, n]``."""

    step: int
    prompt: np.ndarray
    prompt_hash: np.ndarray
    reward: np.ndarray
    correct: np.ndarray


def read_outcomes(path: Path, set_name: str = "") -> PromptOutcomes:
    """The outcomes of validation set ``set_name`` in the file :func:`write_outcomes` wrote."""
    by_prompt: dict[int, tuple[str, dict[int, tuple[float, float]]]] = {}
    step = -1
    with gzip.open(path, "rt", encoding="utf-8", newline="") as lines:
        reader = csv.reader(lines)
        if next(reader, None) != OUTCOMES_HEADER:
            raise ValueError(f"{path}: expected the header {','.join(OUTCOMES_HEADER)}")
        for row_set, prompt, digest, sample, row_step, reward, correct in reader:
            if row_set == set_name:
                by_prompt.setdefault(int(prompt), (digest, {}))[1][int(sample)] = (float(reward), float(correct))
                step = int(row_step)
    if not by_prompt:
        raise ValueError(f"{path}: no outcomes of the validation set {set_name!r}")
    prompts = sorted(by_prompt)
    samples = {len(by_prompt[p][1]) for p in prompts}
    if len(samples) != 1:
        raise ValueError(f"{path}: prompts of set {set_name!r} have different numbers of samples {sorted(samples)}")
    table = np.asarray([[by_prompt[p][1][s] for s in sorted(by_prompt[p][1])] for p in prompts], dtype=float)
    return PromptOutcomes(step, np.asarray(prompts, dtype=np.int64), np.asarray([by_prompt[p][0] for p in prompts]),
                          table[..., 0], table[..., 1])  # fmt: skip

