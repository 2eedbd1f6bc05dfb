"""The registries of parts: name -> part, for one option each (``--model.advantage``,
``--model.aggregation``, ``--model.loss.surrogate``, ``--model.kl.placement``).

A part is registered by a decorator (``@register_advantage("my_adv")``), ours and a user's alike;
every caller looks its part up here by name, so a registered part is chosen like a shipped one. An
option also takes an import path, as ``rewards.funcs`` does: ``my_module.my_adv`` imports
``my_module`` (which may register its parts on import) and takes the part registered as ``my_adv``,
or registered from the object ``my_module.my_adv``, or registers that object under the path.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from grpo_lightning.errors import ConfigError


def import_module(path: str) -> Any:
    """The module at ``path``; its top package may be a file or folder of the working directory, as
    for ``rewards.funcs``: console scripts leave the working directory off ``sys.path``."""
    top, cwd = path.partition(".")[0], os.getcwd()
    if cwd not in sys.path and "" not in sys.path and any(
        os.path.isfile(os.path.join(cwd, *where)) for where in ((top + ".py",), (top, "__init__.py"))
    ):
        sys.path.append(cwd)
    return importlib.import_module(path)


def function_part(given: Any) -> Any:
    """``given`` if it is a function (a callable that is not a class), else ``None``."""
    return given if callable(given) and not isinstance(given, type) else None


class Registry(dict):
    """Name -> part for ``option``. ``adapt`` makes a part of what a decorator or an import path
    gives (a function, a class, an instance), or returns ``None`` for what is not one; ``kind`` says
    what a part of this option is, in errors."""

    def __init__(self, option: str, kind: str, adapt: Callable[[Any], Any] = function_part) -> None:
        super().__init__()
        self.option, self.kind, self.adapt = option, kind, adapt
        self.sources: dict[str, Any] = {}  # name -> what was registered (before adapt): found by an import path

    def register(self, name: str, given: Any, part: Any = None) -> Any:
        """Register ``part`` (default: ``given`` adapted) as ``name``, found by ``given`` on an import
        path, and return ``given``. Registering it again under the same name is a no-op (a module
        imported twice); another part under a taken name is a ``ValueError``."""
        if self.sources.get(name) is given:
            return given
        if name in self:
            raise ValueError(f"{self.option}: {name!r} is registered already ({self.sources.get(name, self[name])!r}); "
                             "register yours under another name.")  # fmt: skip
        part = self.adapt(given) if part is None else part
        if part is None:
            raise ValueError(f"{self.option}: {given!r} is not {self.kind}.")
        self[name], self.sources[name] = part, given
        return given

    def decorator(self, name: str | None) -> Callable[[Any], Any]:
        """``@decorator("name")``: registers what it decorates as ``name`` (its ``__name__`` for ``None``)."""
        return lambda given: self.register(name or given.__name__, given)

    def resolve(self, spec: str | None) -> str | None:
        """The registered name of ``spec``: a registered name, or an import path (see the module's
        docstring); ``None`` stays ``None`` (the variant's own). Anything else is a :class:`ConfigError`
        naming the option and the registered names."""
        if spec is None or spec in self:
            return spec
        module_path, _, attribute = spec.rpartition(".")
        if not module_path:
            raise self.unknown(spec, "")
        try:
            module = import_module(module_path)
        except Exception as error:  # not found, or it failed while importing
            raise self.unknown(spec, f" ({module_path} does not import: {type(error).__name__}: {error})") from error
        given = getattr(module, attribute, None)
        # Registered on import: the object the path names, or a part of that module under the path's last name.
        named = [
            name for name, source in self.sources.items()
            if (given is not None and source is given)
            or (name == attribute and getattr(source, "__module__", "") == module_path)
        ]  # fmt: skip
        if named:
            return named[0]
        if given is None:
            raise self.unknown(spec, f" ({module_path} has no {attribute!r} and registers none)")
        try:
            self.register(spec, given)
        except ValueError as error:
            raise ConfigError(str(error)) from error
        return spec

    def unknown(self, spec: str, why: str) -> ConfigError:
        return ConfigError(
            f"{self.option}: {spec!r} is not one of {', '.join(self)}{why}; e.g. --model.{self.option} "
            f"{next(iter(self))}, an import path to your own ({self.kind}, e.g. package.module.name, or a module "
            "that registers it on import), or null for the variant's own."
        )
