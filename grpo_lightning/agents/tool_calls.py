"""Tool calls parsed from a model's turn, in the format its chat template teaches.

A format is a function ``text -> list[ToolCall]``, registered by name in :data:`TOOL_CALL_FORMATS`
or given as a callable or an import path (:func:`resolve_tool_call_format`). A call whose text
cannot be read comes back with its ``error`` set, so that the model is told, and the error counted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpo_lightning.errors import ConfigError

_JSON_TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's ``name`` and its keyword ``arguments``; ``error``: why the call's text
    could not be read (then ``name`` may be empty)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def json_tag_calls(text: str) -> list[ToolCall]:
    """Calls written as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``: the format of
    the Qwen2.5/Qwen3, SmolLM2/3 and Hermes chat templates (an unclosed last tag counts, as the turn
    may end right after the JSON)."""
    calls = []
    for body in _JSON_TAG.findall(text):
        try:
            value = json.loads(body.strip())
        except json.JSONDecodeError as error:
            calls.append(ToolCall("", error=f"the tool call is not valid JSON ({error.msg})"))
            continue
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            calls.append(ToolCall("", error='a tool call must be a JSON object with a "name"'))
            continue
        arguments = value.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            calls.append(ToolCall(value["name"], error='"arguments" must be a JSON object'))
            continue
        calls.append(ToolCall(value["name"], arguments))
    return calls


#: Tool-call formats by name.
TOOL_CALL_FORMATS: dict[str, Callable[[str], list[ToolCall]]] = {"json_tags": json_tag_calls}


def resolve_tool_call_format(spec: str | Callable[[str], list[ToolCall]]) -> Callable[[str], list[ToolCall]]:
    """The parser of ``spec``: a name of :data:`TOOL_CALL_FORMATS`, an import path ``module.function``, or a callable."""
    if callable(spec):
        return spec
    if spec in TOOL_CALL_FORMATS:
        return TOOL_CALL_FORMATS[spec]
    return import_object(spec, "tool_call_format", f"a name of {sorted(TOOL_CALL_FORMATS)} or ")


def import_object(path: str, field_name: str, alternatives: str = "") -> Any:
    """The object an import path ``package.module.name`` names; a :class:`ConfigError` naming ``field_name`` if none."""
    import importlib

    module_name, _, name = str(path).rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigError(
            f"{field_name}: {path!r} does not import ({error}); give {alternatives}an import path like 'my_package.module.name'."
        ) from None
