"""Tool calls parsed from a model's turn, in the format its chat template teaches.

A format is a function ``text -> list[ToolCall]``, registered by name in :data:`TOOL_CALL_FORMATS`
or given as a callable or an import path (:func:`resolve_tool_call_format`). A call whose text
cannot be read comes back with its ``error`` set, so that the model is told, and the error counted.
JSON is read only within :data:`MAX_CALL_CHARS` characters and :data:`MAX_JSON_DEPTH` levels of
nesting, checked before parsing: a model's degenerate output (thousands of ``[``) is a bad call, never
an exception that would end the fit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpo_lightning.errors import ConfigError

_JSON_TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
#: Characters of JSON read for one call (or one Llama turn of calls); longer is a bad call.
MAX_CALL_CHARS = 20_000
#: Levels of ``[``/``{`` nesting a call's JSON may have; deeper is a bad call (the parser recurses per level).
MAX_JSON_DEPTH = 64


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
    return [_json_call(body, "arguments") for body in _JSON_TAG.findall(text)]


def llama_json_calls(text: str) -> list[ToolCall]:
    """Calls written as the Llama 3.1-3.3 chat templates ask: the turn is a JSON object
    ``{"name": ..., "parameters": {...}}`` (after an optional ``<|python_tag|>``), or several joined by
    ``;``. A turn that does not start with ``{`` is an answer, not a call."""
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return []
    if (error := unreadable_json(body)) is not None:
        return [ToolCall("", error=error)]
    calls, decoder, position = [], json.JSONDecoder(), 0
    while position < len(body):
        try:
            value, end = decoder.raw_decode(body, position)
        except json.JSONDecodeError as error:
            return [*calls, ToolCall("", error=f"the tool call is not valid JSON ({error.msg})")]
        calls.append(_json_call(value, "parameters"))
        position = end
        while position < len(body) and body[position] in " \n\t;":
            position += 1
    return calls


def _json_call(body: str | Any, arguments_key: str) -> ToolCall:
    """A call from its JSON text (or its parsed value): ``name`` and its arguments under
    ``arguments_key`` (``arguments`` is read too)."""
    if isinstance(body, str):
        if (error := unreadable_json(body)) is not None:
            return ToolCall("", error=error)
        try:
            body = json.loads(body.strip())
        except json.JSONDecodeError as error:
            return ToolCall("", error=f"the tool call is not valid JSON ({error.msg})")
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        return ToolCall("", error='a tool call must be a JSON object with a "name"')
    arguments = body.get(arguments_key, body.get("arguments", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        if (error := unreadable_json(arguments)) is not None:
            return ToolCall(body["name"], error=f'"{arguments_key}": {error}')
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(body["name"], error=f'"{arguments_key}" must be a JSON object')
    return ToolCall(body["name"], arguments)


def unreadable_json(text: str) -> str | None:
    """Why ``text`` is not parsed as JSON (longer than :data:`MAX_CALL_CHARS`, or nested deeper than
    :data:`MAX_JSON_DEPTH`), or ``None``: a bound checked before the recursive parser sees it."""
    if len(text) > MAX_CALL_CHARS:
        return f"the tool call is longer than {MAX_CALL_CHARS} characters"
    if json_depth(text) > MAX_JSON_DEPTH:
        return f"the tool call nests JSON deeper than {MAX_JSON_DEPTH} levels"
    return None


def json_depth(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` in ``text`` outside JSON strings, in one pass without recursion."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(depth - 1, 0)  # a stray closer must not hide the openers after it
    return deepest


#: Tool-call formats by name.
TOOL_CALL_FORMATS: dict[str, Callable[[str], list[ToolCall]]] = {"json_tags": json_tag_calls, "llama_json": llama_json_calls}


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
