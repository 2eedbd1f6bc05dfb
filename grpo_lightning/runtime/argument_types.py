"""Constructor arguments against their annotations, so a wrong type is a :class:`ConfigError` naming
the field, not a ``TypeError`` from a comparison deep inside.

Checked: ``int`` (within int64: every count and size ends up in a tensor or a C call, where a larger
one fails far from its cause), ``float`` (finite: NaN, inf and integers past a float's range are
refused), ``bool``, ``str``, ``None`` and ``Literal[...]``, and unions of them (``int | None``). Annotations with anything else
(``Sequence[str | Callable]``, ``EngineOptions``, ``Any``) are left to the checks of their own.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

from grpo_lightning.errors import ConfigError

_SIMPLE = (int, float, bool, str, type(None))
INT64_MAX = 2**63 - 1


@functools.cache
def annotated_arguments(cls: type) -> dict[str, tuple[tuple[Any, ...], Any]]:
    """``{name: (accepted, default)}`` of the constructor arguments of ``cls`` and its bases with a
    checkable annotation; ``accepted`` holds simple types and ``Literal`` values (the most derived
    class's annotation wins)."""
    found: dict[str, tuple[tuple[Any, ...], Any]] = {}
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None or not inspect.isfunction(init):
            continue
        namespace = vars(sys.modules.get(klass.__module__, typing))
        for name, parameter in inspect.signature(init).parameters.items():
            if name in found or parameter.annotation is inspect.Parameter.empty:
                continue
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                continue
            accepted = _accepted(_evaluate(parameter.annotation, namespace))
            if accepted is not None:
                found[name] = (accepted, parameter.default)
    return found


def check_argument_types(cls: type, values: Mapping[str, Any], field: str = "", cli: str = "--model.") -> None:
    """Raise :class:`ConfigError` for the first of ``values`` that its annotation on the constructor
    of ``cls`` (or a base) refuses, naming it as ``<field><name>`` with an example ``<cli><name> <default>``."""
    for name, (accepted, default) in annotated_arguments(cls).items():
        if name in values and not any(_matches(values[name], option) for option in accepted):
            example = (
                "" if default is inspect.Parameter.empty or default is None else f"; e.g. {cli}{name} {_cli(default)}"
            )
            value = values[name]
            if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(value) > INT64_MAX:
                limit = f"an integer must fit in 64 bits (at most {INT64_MAX} in magnitude)"
                if int not in accepted:
                    limit = "a number must fit in a float"
                raise ConfigError(f"{field}{name}: {_shown(value)} is too large; {limit}{example}.")
            raise ConfigError(f"{field}{name}: must be {_describe(accepted)} (got {value!r}){example}.")


def _evaluate(annotation: Any, namespace: Mapping[str, Any]) -> Any:
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, dict(namespace))  # the module's own names: Literal, Callable, ...
    except (NameError, AttributeError, SyntaxError, TypeError):  # e.g. a name imported for type checkers only
        return None


def _accepted(annotation: Any) -> tuple[Any, ...] | None:
    """The simple types and ``Literal`` values ``annotation`` accepts, or ``None`` when it names
    anything else (not checked here)."""
    if annotation is None:
        return (type(None),)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        parts = [_accepted(member) for member in typing.get_args(annotation)]
        return None if any(part is None for part in parts) else tuple(o for part in parts for o in part)
    if origin is Literal:
        return (annotation,)
    return (annotation,) if annotation in _SIMPLE else None


def _matches(value: Any, accepted: Any) -> bool:
    if typing.get_origin(accepted) is Literal:
        return any(type(value) is type(option) and value == option for option in typing.get_args(accepted))
    if accepted is bool:
        return isinstance(value, bool)
    if accepted is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(value) <= INT64_MAX
    if accepted is float:
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        try:
            return real and math.isfinite(value)
        except OverflowError:  # an integer too large for a float
            return False
    return isinstance(value, accepted)


def _describe(accepted: tuple[Any, ...]) -> str:
    words = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string", type(None): "null"}
    parts = []
    for option in accepted:
        if typing.get_origin(option) is Literal:
            parts.append("one of " + ", ".join(map(repr, typing.get_args(option))))
        else:
            parts.append(words[option])
    return " or ".join(dict.fromkeys(parts))


def _shown(value: numbers.Integral) -> str:
    """A huge integer for a message (``repr`` refuses integers of over 4300 digits)."""
    digits = int(int(value).bit_length() * math.log10(2)) + 1
    return repr(value) if digits < 40 else f"an integer of about {digits} digits"


def _cli(value: Any) -> str:
    """``value`` as written on the command line."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and (not value.isprintable() or not value or any(c.isspace() for c in value)):
        return repr(value)
    return str(value)
