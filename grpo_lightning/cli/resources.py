"""The shipped YAML configs: ``configs/`` of a clone, ``grpo_lightning/configs`` once installed.

A config is named by its path below that folder, with or without the leading ``configs/`` and
the ``.yaml`` suffix: ``trainer/cpu.yaml``, ``configs/trainer/cpu.yaml`` and ``trainer/cpu`` are
the same file. A path that exists relative to the working directory always wins, so the
commands of the README work unchanged from a clone and, after ``pip install``, from anywhere.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

#: The package the configs are installed as (``configs/`` is mapped onto it when packaging).
CONFIG_PACKAGE = "grpo_lightning.configs"
#: ``configs/`` of a source checkout, one level above the package.
SOURCE_CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
#: The command-line flags that take a config file.
CONFIG_FLAGS = ("--config", "-c")


def config_dir() -> Path:
    """The folder of the shipped configs: the installed package data, else the checkout's ``configs/``."""
    spec = importlib.util.find_spec(CONFIG_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        if Path(location).is_dir():
            return Path(location)
    return SOURCE_CONFIG_DIR


def shipped_config(name: str | Path) -> Path | None:
    """The shipped config called ``name`` (see the module docstring), or ``None``."""
    parts = Path(name).parts
    if parts and parts[0] == "configs":
        parts = parts[1:]
    if not parts or Path(name).is_absolute() or ".." in parts:
        return None
    path = config_dir().joinpath(*parts)
    for candidate in (path, path.with_name(path.name + ".yaml")):
        if candidate.is_file():
            return candidate
    return None


def config_path(name: str | Path) -> Path:
    """The shipped config called ``name``; ``FileNotFoundError`` names the shipped ones otherwise."""
    shipped = shipped_config(name)
    if shipped is None:
        raise FileNotFoundError(f"no shipped config {name}; shipped configs: {', '.join(shipped_config_names())}.")
    return shipped


def resolve_config(name: str | Path) -> Path:
    """A config file: ``name`` itself where it exists (relative to the working directory), else
    the shipped config of that name."""
    path = Path(name).expanduser()
    if path.is_file():
        return path.absolute()
    try:
        return config_path(name)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"{name} is not a file, and {error}") from None


def shipped_config_names() -> list[str]:
    """Every shipped config, as ``trainer/cpu.yaml``."""
    root = config_dir()
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.yaml"))


def resolve_config_args(args: Sequence[str]) -> list[str]:
    """Command-line arguments with each ``--config NAME`` that is not a file made a shipped config's path.

    Values that are neither a file nor a shipped config are left for the parser to report.
    """
    resolved = list(args)
    for i, arg in enumerate(resolved):
        flag, sep, value = arg.partition("=")
        if flag not in CONFIG_FLAGS:
            continue
        if sep:
            resolved[i] = f"{flag}={_resolve(value)}"
        elif i + 1 < len(resolved):
            resolved[i + 1] = _resolve(resolved[i + 1])
    return resolved


def _resolve(value: str) -> str:
    if Path(value).expanduser().exists():
        return value
    shipped = shipped_config(value)
    return value if shipped is None else str(shipped)
