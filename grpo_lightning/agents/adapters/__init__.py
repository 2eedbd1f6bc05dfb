"""Environments written for other libraries, run as this one's multi-turn environments and told apart
by their class: a verifiers ``Taskset`` (:mod:`~grpo_lightning.agents.adapters.verifiers`), an OpenEnv
``Environment`` or ``EnvClient`` (:mod:`~grpo_lightning.agents.adapters.openenv`), or a class of TRL's
``environment_factory`` contract (:mod:`~grpo_lightning.agents.adapters.trl`).

verifiers and OpenEnv are optional (the extras ``verifiers`` and ``openenv``) and nothing here imports
them: a class derives from theirs only once they are imported, so telling it apart needs no import."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpo_lightning.agents.adapters.openenv import follows_openenv_contract, openenv_environment
from grpo_lightning.agents.adapters.trl import follows_trl_contract, trl_environment
from grpo_lightning.agents.adapters.verifiers import follows_verifiers_contract, verifiers_environment

#: Each library's contract: whether a class follows it, and a new environment of such a class built with
#: ``environment.args`` (the class, the args, its import path). Tried in this order: an OpenEnv client's
#: ``reset(**kwargs)`` would pass for TRL's.
ADAPTERS: dict[str, tuple[Callable[[Any], bool], Callable[[type, dict[str, Any], str], Any]]] = {
    "verifiers": (follows_verifiers_contract, verifiers_environment),
    "openenv": (follows_openenv_contract, openenv_environment),
    "trl": (follows_trl_contract, trl_environment),
}


def adapted_environment(factory: Any, args: dict[str, Any], name: str) -> Any | None:
    """A new environment of ``factory`` where it is a class of another library's contract, else ``None``."""
    if isinstance(factory, type):
        for follows, build in ADAPTERS.values():
            if follows(factory):
                return build(factory, args, name)
    return None
