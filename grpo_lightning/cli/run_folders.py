"""Which folder a CLI command reads and writes: a run lives in ``<save_dir>/<name>/version_N``
(checkpoints in its ``checkpoints/``); an evaluation of it logs beside it, never into it; ``--ckpt_path
last`` names the newest ``last.ckpt`` of the runs of that name. A folder holds one history: a fit
resumed into the folder of its checkpoint continues from the folder's newest checkpoint only (an older
one would start a second branch beside the first, :func:`check_resume_folder`), and its logs keep what
came before that checkpoint and drop what a killed fit logged after it
(:func:`purge_steps_after_checkpoint`). A fit's TensorBoard and CSV loggers share one version folder
(:func:`share_version_folder`)."""

from __future__ import annotations

import csv
import os
import warnings
from pathlib import Path

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from grpo_lightning.runtime.checkpoint_io import checkpoint_step, last_checkpoints
from grpo_lightning.errors import ConfigError


def evaluation_version(save_dir: str, name: str, subcommand: str, version: int | str | None) -> int | str:
    """The logger version of ``validate``/``test``/``generate``: ``version`` when its folder does not
    exist yet, else the first free ``<subcommand>_<k>`` under ``<save_dir>/<name>``, never a run's own
    folder (a run's ``config.yaml`` names its version when it was resumed)."""
    parent = Path(save_dir).expanduser() / name
    if version is not None and not (parent / (f"version_{version}" if isinstance(version, int) else version)).exists():
        return version
    k = 0
    while (parent / f"{subcommand}_{k}").exists():
        k += 1
    return f"{subcommand}_{k}"


def last_checkpoint_of_run(trainer, default_name: str) -> tuple[Path, str]:
    """``--ckpt_path last``: the newest ``last*.ckpt`` in ``<save_dir>/<name>/version_*/checkpoints``
    (the logger's name, else ``default_name``), ``<default_root_dir>/checkpoints`` or a
    ModelCheckpoint's ``dirpath`` of the ``trainer`` config, and a line that names it, its optimizer
    step and the other runs' last checkpoints it was chosen over (a later short fit of the same name
    is newer than a long one); a :class:`ConfigError` when there is none."""
    logger = trainer.get("logger")
    init_args = (logger.get("init_args") if hasattr(logger, "get") else None) or {}
    name = init_args.get("name")
    name = default_name if name in (None, "lightning_logs") else name
    root = Path(str(trainer.get("default_root_dir") or ".")).expanduser()
    save_dir = Path(str(init_args.get("save_dir") or root)).expanduser()
    folders = [save_dir / name / "version_*" / "checkpoints", root / "checkpoints"]
    for callback in trainer.get("callbacks") or []:
        dirpath = (callback.get("init_args") or {}).get("dirpath") if hasattr(callback, "get") else None
        if dirpath and str(callback.get("class_path", "")).endswith("ModelCheckpoint"):
            folders.append(Path(str(dirpath)).expanduser())
    candidates = last_checkpoints(folders)
    if not candidates:
        raise ConfigError(
            f"--ckpt_path last: no last.ckpt of a run named {name!r} in {save_dir / name}/version_*/checkpoints "
            "(nor in a ModelCheckpoint's dirpath); give a checkpoint file, or leave --ckpt_path out to start anew."
        )
    found, others = candidates[0], [p for p in candidates[1:] if p.resolve() != candidates[0].resolve()]
    line = f"--ckpt_path last: {found} (optimizer step {checkpoint_step(found)})"
    if others:
        listed = ", ".join(f"{p} (step {checkpoint_step(p)})" for p in others[:3]) + (", ..." if len(others) > 3 else "")
        line += f", the newest written of {len(others) + 1} last checkpoints; the others: {listed}"
    return found, line


def checkpoint_folders(trainer) -> list[tuple[Path, bool]]:
    """The folders a fit of ``trainer`` writes checkpoints to, as each ``ModelCheckpoint`` resolves
    its own at setup (its ``dirpath``, else the first logger's ``<save_dir>/<name>/<version>/checkpoints``,
    else ``<default_root_dir>/checkpoints``), each with whether the ``dirpath`` was given."""
    folders = []
    for callback in trainer.checkpoint_callbacks:
        if not isinstance(callback, ModelCheckpoint):
            continue
        if callback.dirpath is not None:
            folders.append((Path(callback.dirpath), True))
        elif trainer.loggers:
            logger = trainer.loggers[0]
            version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
            save_dir = logger.save_dir if logger.save_dir is not None else trainer.default_root_dir
            folders.append((Path(save_dir) / str(logger.name) / version / "checkpoints", False))
        else:
            folders.append((Path(trainer.default_root_dir) / "checkpoints", False))
    return folders


def newest_checkpoint_beside(path: Path, step: int) -> tuple[Path, int] | None:
    """The checkpoint file beside ``path`` with the most optimizer steps, when that is more than
    ``step`` (``last*.ckpt`` first among equals), else ``None``; unreadable files are skipped."""
    newest = None
    for other in sorted(path.parent.glob("*.ckpt")):
        if not other.is_file() or other.resolve() == path:
            continue
        other_step = checkpoint_step(other)
        if other_step is None or other_step <= step:
            continue
        rank = (other_step, other.name.startswith("last"))
        if newest is None or rank > (newest[1], newest[0].name.startswith("last")):
            newest = (other, other_step)
    return newest


def check_resume_folder(trainer, ckpt_path: str | os.PathLike) -> None:
    """A :class:`ConfigError` when the fit of ``trainer``, resumed from ``ckpt_path``, would write its
    checkpoints (and, through its logger's version, its logs) into the folder of ``ckpt_path`` while
    that folder holds a checkpoint of a later step: the fit would start a second history beside the
    first (``last.ckpt`` and ``last-v1.ckpt``, two curves in one TensorBoard run). The error names
    both checkpoints, the newest to continue the run from, and how to branch into a folder of its own."""
    path = Path(ckpt_path).expanduser().resolve()
    if not path.is_file():
        return
    targets = [(folder, given) for folder, given in checkpoint_folders(trainer)
               if folder.expanduser().resolve() == path.parent]  # fmt: skip
    if not targets:
        return
    step = checkpoint_step(path)
    newer = newest_checkpoint_beside(path, step) if step is not None else None
    if newer is None:
        return
    logger = trainer.loggers[0] if trainer.loggers else None
    if any(given for _, given in targets):
        branch = "another --trainer.callbacks.dirpath for its ModelCheckpoint"
    elif isinstance(getattr(logger, "version", None), int) and hasattr(logger, "_get_next_version"):
        branch = f"--trainer.logger.init_args.version {logger._get_next_version()} (a new version folder)"
    elif logger is not None:
        branch = "another --trainer.logger.init_args.version (a new version folder)"
    else:
        branch = "another --trainer.default_root_dir"
    raise ConfigError(
        f"--ckpt_path {ckpt_path} (optimizer step {step}) is older than {newer[0]} (optimizer step {newer[1]}) "
        f"in the same run folder: resuming it there would write a second history beside the first. "
        f"To continue the run, resume from {newer[0]} (or --ckpt_path last); to branch from step {step}, "
        f"give the fit a folder of its own: {branch}."
    )


def share_version_folder(trainer) -> None:
    """Loggers of one fit that write under the same ``<save_dir>/<name>`` without a version given take
    the first one's version: each would otherwise take the next free one when it first writes, after
    the other had made its own (TensorBoard's events and the checkpoints in ``version_0``,
    ``metrics.csv`` in ``version_1``)."""
    versioned = [logger for logger in trainer.loggers if isinstance(logger, (TensorBoardLogger, CSVLogger))]
    if len(versioned) < 2:
        return
    first = versioned[0]
    for logger in versioned[1:]:
        if logger._version is None and Path(logger.root_dir).resolve() == Path(first.root_dir).resolve():
            logger._version = first.version


def purge_steps_after_checkpoint(trainer, ckpt_path: str | os.PathLike) -> None:
    """Have the loggers of a fit resumed from ``ckpt_path`` drop the steps after the checkpoint's and
    keep those before, so each step shows once, as the resumed fit logs it, after a kill:

    - TensorBoard gets ``purge_step``: the checkpoint's optimizer steps + 1, the step its next
      training row is logged at (``val/*`` of the checkpoint's own step stays, since a resumed fit
      does not validate it again);
    - CSV keeps the rows of ``metrics.csv`` up to the checkpoint's step (Lightning's writer would
      delete the whole file as it starts), :func:`keep_csv_rows_up_to`.

    Nothing where the checkpoint's step cannot be read."""
    step = checkpoint_step(ckpt_path) if Path(ckpt_path).is_file() else None
    if step is None:
        return
    for logger in trainer.loggers:
        kwargs = getattr(logger, "_kwargs", None)
        if isinstance(logger, TensorBoardLogger) and isinstance(kwargs, dict) and logger._experiment is None:
            if kwargs.get("purge_step") is None:  # the CLI fills in SummaryWriter's default, None
                kwargs["purge_step"] = step + 1
        elif isinstance(logger, CSVLogger) and logger._experiment is None and trainer.is_global_zero:
            keep_csv_rows_up_to(logger, step)


def keep_csv_rows_up_to(logger: CSVLogger, step: int) -> None:
    """Start ``logger``'s writer on its ``metrics.csv`` holding the file's rows of steps up to ``step``
    (rows without a step too). The file is moved aside before the writer starts (which deletes it) and
    removed once the kept rows are written again, so a kill in between leaves it beside, not lost."""
    path = Path(logger.log_dir) / "metrics.csv"
    if not path.is_file():
        return
    with path.open(newline="") as file:
        reader = csv.DictReader(file)
        keys = list(reader.fieldnames or [])
        kept = [row for row in reader if not (row.get("step") or "").isdigit() or int(row["step"]) <= step]
    aside = path.with_name("metrics.csv.before-resume")
    os.replace(path, aside)
    with warnings.catch_warnings():  # "... will be deleted": the rows kept are written back next
        warnings.filterwarnings("ignore", message="Experiment logs directory")
        writer = logger.experiment
    writer.metrics_keys = keys
    writer.metrics = kept + writer.metrics
    writer.save()
    aside.unlink()
