"""Which folder a CLI command reads and writes: a run lives in ``<save_dir>/<name>/version_N``
(checkpoints in its ``checkpoints/``); an evaluation of it logs beside it, never into it; ``--ckpt_path
last`` names the newest ``last.ckpt`` of the runs of that name."""

from __future__ import annotations

from pathlib import Path

from grpo_lightning.runtime.checkpoint_io import newest_last_checkpoint
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


def last_checkpoint_of_run(trainer, default_name: str) -> Path:
    """``--ckpt_path last``: the newest ``last*.ckpt`` in ``<save_dir>/<name>/version_*/checkpoints``
    (the logger's name, else ``default_name``), ``<default_root_dir>/checkpoints`` or a
    ModelCheckpoint's ``dirpath`` of the ``trainer`` config; a :class:`ConfigError` when there is none."""
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
    found = newest_last_checkpoint(folders)
    if found is None:
        raise ConfigError(
            f"--ckpt_path last: no last.ckpt of a run named {name!r} in {save_dir / name}/version_*/checkpoints "
            "(nor in a ModelCheckpoint's dirpath); give a checkpoint file, or leave --ckpt_path out to start anew."
        )
    return found
