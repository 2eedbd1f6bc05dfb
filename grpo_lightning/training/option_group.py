"""What every option group of the module shares: building from a dict, the type check, the value checks, plain values."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from grpo_lightning.errors import ConfigError
from grpo_lightning.training.argument_types import check_argument_types


def require(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True)
class OptionGroup:
    """What every group shares: building from a dict, the type check, plain values. A dataclass
    itself, so that the CLI shows each group as its fields (no ``class_path``)."""

    #: The constructor argument of ``GroupPolicyOptimization`` that takes the group.
    group: ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_argument_types(type(self), {f.name: getattr(self, f.name) for f in fields(self)},
                             field=f"{self.group}.", cli=f"--model.{self.group}.")  # fmt: skip
        self.check()

    def check(self) -> None:
        """Raise :class:`ConfigError` for a value that cannot run (the types are checked already)."""

    @classmethod
    def of(cls, value: Any, preset: Any = None) -> Any:
        """``value`` itself, or ``preset`` (default: the class's defaults) with the fields a dict
        names (the CLI's, a checkpoint's hyperparameters); an unknown field is a :class:`ConfigError`."""
        preset = cls() if preset is None else cls.of(preset)
        if value is None:
            return preset
        if isinstance(value, Mapping):
            names = [f.name for f in fields(cls)]
            unknown = sorted(set(value) - set(names))
            if unknown:
                raise ConfigError(f"{cls.group}: no option {unknown[0]!r}; give {', '.join(names)}.")
            return dataclasses.replace(preset, **value)
        if not isinstance(value, cls):
            raise ConfigError(f"{cls.group}: give {cls.__name__} or a dict of its fields, got {value!r}.")
        return value

    def state(self) -> dict[str, Any]:
        """Plain values, for the hyperparameters (``hparams.yaml``, checkpoints, loggers)."""
        return asdict(self)
