"""The optional libraries of the adapters: imported only where an adapter needs them, and, when one is
missing, an error that names the extra installing it."""

from __future__ import annotations

import importlib
from typing import Any

from grpo_lightning.agents.tool_calls import import_object
from grpo_lightning.errors import ConfigError

#: The extra of ``grpo-lightning`` that installs each optional library, by its top-level package.
EXTRAS = {"verifiers": "verifiers", "openenv": "openenv", "openenv_core": "openenv"}


def missing_extra(package: str, what: str) -> ConfigError:
    """The error of ``what`` needing ``package``, which is not installed."""
    return ConfigError(f"{what} needs the package {package!r}, which is not installed: pip install "
                       f"'grpo-lightning[{EXTRAS[package]}]'.")  # fmt: skip


def import_optional_object(path: str, field_name: str) -> Any:
    """:func:`~grpo_lightning.agents.tool_calls.import_object`, where a module that needs a missing
    optional library (``verifiers``, ``openenv``) names the extra to install."""
    module = str(path).rpartition(".")[0]
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name in EXTRAS:  # the library itself, not a module missing inside it
            raise missing_extra(error.name, f"{field_name}: {path}") from None
    except Exception:  # noqa: BLE001 - import_object reports every other failure, naming the field
        pass
    return import_object(path, field_name)
