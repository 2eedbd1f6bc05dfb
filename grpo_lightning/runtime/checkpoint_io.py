"""Checkpoint files that survive a kill: written atomically, checked before they are read.

:class:`AtomicCheckpointIO` is the ``CheckpointIO`` of every fit the CLI runs; with a plain Trainer,
``L.Trainer(plugins=[AtomicCheckpointIO()])``. It writes a checkpoint to a temporary file in the
checkpoint's own directory (``.<name>.<random>.tmp``), flushes and fsyncs it, then renames it over
the final name (``os.replace``, atomic within one file system) and fsyncs the directory. A process
killed while writing leaves the previous file under that name (or none) and a stray temporary file
(removed by the next write of that name), never a truncated checkpoint. Lightning's own writer
stages the file in the system's temporary directory and moves it: a copy into the final name when
that is on another file system, and no fsync.

A truncated or corrupt file given to resume from is a :class:`CorruptCheckpointError` naming it and
the newest complete checkpoint of the same directory to resume from instead: :func:`check_checkpoint`
(cheap: the archive's index and its ``data.pkl`` record with their CRCs, not its tensors) runs on the
CLI's ``--ckpt_path`` before any model is built, and in :meth:`AtomicCheckpointIO.load_checkpoint` for
paths Lightning resolves (``"last"``).

Every read is ``torch.load(..., weights_only=True)`` (:func:`load_checkpoint_file`): a checkpoint's
pickle may name only tensors and plain values, so a crafted file cannot run code when it is read; one
that names anything else is an :class:`UnsafeCheckpointError`. grpo-lightning's own checkpoints need no
allow-listed global (a test loads one written by a real CLI fit).

FSDP (:class:`~grpo_lightning.runtime.strategies.PolicyFSDPStrategy`): with ``state_dict_type="full"`` rank 0
writes the one file through the trainer's CheckpointIO, so it is atomic too; a ``"sharded"``
checkpoint is a directory written by ``torch.distributed.checkpoint``, and neither atomic nor checked.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pickle
import re
import uuid
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins import TorchCheckpointIO

from grpo_lightning.errors import ConfigError

#: ``ckpt_path`` values Lightning resolves itself rather than reading as a file.
SPECIAL_CKPT_PATHS = ("best", "last", "hpc", "registry")


class CorruptCheckpointError(ConfigError):
    """A checkpoint file that is truncated or corrupt (e.g. its run was killed while writing it)."""


class UnsafeCheckpointError(ConfigError):
    """A checkpoint whose pickle names a global that is not plain data: loading it would run code."""


def damage(path: str | os.PathLike) -> str | None:
    """Why the file at ``path`` is not a complete ``torch.save`` archive, or ``None`` when it is one.
    Reads the archive's index (at its end) and its ``data.pkl`` record (checked against its CRC), not
    the tensors' records."""
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [name for name in archive.namelist() if name.endswith("data.pkl")]
            if not pickles:
                return "an archive without a data.pkl record"
            archive.read(pickles[0])  # its local header and CRC-32: torch's reader checks neither
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError) as error:
        return f"{os.path.getsize(path)} bytes, not a complete archive: {error}"
    return None


def newest_complete_checkpoint(path: str | os.PathLike) -> Path | None:
    """The most recently written complete ``*.ckpt`` file in the directory of ``path``, other than it."""
    path = Path(path)
    others = [p for p in path.parent.glob("*.ckpt") if p.is_file() and p.resolve() != path.resolve()]
    for candidate in sorted(others, key=lambda p: (p.stat().st_mtime_ns, p.name), reverse=True):
        if damage(candidate) is None:
            return candidate
    return None


def last_checkpoints(folders: list[Path]) -> list[Path]:
    """The ``last*.ckpt`` files in ``folders`` (glob patterns allowed), the most recently written first."""
    found = {Path(p) for folder in folders for p in glob.glob(str(Path(folder) / "last*.ckpt")) if os.path.isfile(p)}
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name), reverse=True)


def corrupt_message(path: str | os.PathLike, reason: str) -> str:
    """The error for a damaged checkpoint: the file, why, and what to resume from instead."""
    good = newest_complete_checkpoint(path)
    fix = (
        f"resume from {good} instead"
        if good is not None
        else "no complete checkpoint is in the same directory: give another ckpt_path or start anew"
    )
    return f"checkpoint {path} is truncated or corrupt ({reason}; e.g. its run was killed while writing it); {fix}."


def check_checkpoint(path: str | os.PathLike | None) -> None:
    """Fail early, naming ``path``, when it is not a checkpoint a fit can resume from: a missing file
    is a ``FileNotFoundError``, a damaged one a :class:`CorruptCheckpointError`. Lightning's own
    values (``"last"``, ``"best"``, ...), URLs and sharded (directory) checkpoints pass unread."""
    if path is None:
        return
    text = str(path)
    if text.split(":")[0] in SPECIAL_CKPT_PATHS or "://" in text or os.path.isdir(text):
        return
    if not os.path.exists(text):
        raise FileNotFoundError(
            f"ckpt_path {text!r} does not exist. Give a checkpoint file written by the run's ModelCheckpoint "
            "(e.g. runs/<name>/version_<n>/checkpoints/last.ckpt)."
        )
    reason = damage(text)
    if reason is not None:
        raise CorruptCheckpointError(corrupt_message(text, reason))


def _unsafe_global(error: BaseException) -> str | None:
    """The global a ``weights_only`` load refused (``posix.system``), or ``None`` for other failures."""
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(error))
    return found.group(1) if found else None


@contextlib.contextmanager
def load_errors_named(path: str | os.PathLike) -> Iterator[None]:
    """Inside the ``with`` block, a failing checkpoint read is one error naming ``path`` and the fix:
    :class:`UnsafeCheckpointError` for a refused global, :class:`CorruptCheckpointError` otherwise."""
    try:
        yield
    except ConfigError:
        raise
    except (pickle.UnpicklingError, RuntimeError, EOFError, UnicodeDecodeError, zipfile.BadZipFile) as error:
        if isinstance(error, RuntimeError) and "PytorchStreamReader" not in str(error):
            raise
        name = _unsafe_global(error)
        if name is not None:
            raise UnsafeCheckpointError(
                f"checkpoint {path} is not loaded: its pickle calls {name}, which is not plain data, so reading it "
                "would run code. grpo-lightning's checkpoints hold tensors and plain values only (hyperparameters "
                "included: give reward functions as import paths, not Python objects); use a file a fit wrote."
            ) from error
        damaged = re.search(r"WeightsUnpickler error: (.+)", str(error))
        reason = f"a damaged pickle: {damaged.group(1).strip()}" if damaged else str(error).split(". ")[0].splitlines()[0]
        raise CorruptCheckpointError(corrupt_message(path, reason)) from error


def load_checkpoint_file(path: str | os.PathLike, mmap: bool = False) -> dict[str, Any]:
    """A checkpoint file's contents on the CPU, read with ``weights_only=True`` after
    :func:`check_checkpoint`; every failure is one error naming the file. ``mmap``: tensors stay on
    disk until touched (reading ``global_step`` of a large file)."""
    check_checkpoint(path)
    with load_errors_named(path):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The ``global_step`` (optimizer steps) a checkpoint file holds, or ``None`` when it cannot be read."""
    try:
        step = load_checkpoint_file(path, mmap=True).get("global_step")
    except (OSError, ConfigError):
        return None
    return int(step) if isinstance(step, int) else None


def _is_local(path: str | os.PathLike) -> bool:
    return isinstance(get_filesystem(path), LocalFileSystem) and "://" not in str(path)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` with atomic, durable writes and checked reads of local files
    (see the module docstring); remote paths (``s3://``, ...) go to Lightning's own."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not _is_local(path):
            return super().save_checkpoint(checkpoint, path, storage_options=storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Created as any new file is (the umask's permissions; mkstemp's would be 0600).
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(descriptor, "wb") as handle:
                torch.save(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(temporary)
            raise
        _fsync_directory(path.parent)
        for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):  # left by a killed write of this name
            with contextlib.suppress(OSError):
                stale.unlink()

    def load_checkpoint(
        self, path: Any, map_location: Callable | None = lambda storage, loc: storage, weights_only: bool | None = None
    ) -> dict[str, Any]:
        if _is_local(path):
            check_checkpoint(path)
        with load_errors_named(path):  # torch's archive reader: a record cut short or failing its CRC, ...
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
