"""Plain Python functions as tools: their JSON schema for the chat template, and running the model's
calls of them, where every failure becomes a message the model reads and a counted error.

A tool is a function with type hints and a Google-style docstring (``Args:`` describing each
argument), as transformers' :func:`~transformers.utils.get_json_schema` reads them. A call runs on
a daemon thread with a time limit; a call past it is reported as a timeout and left to finish on
its own (a thread cannot be stopped): a tool that runs untrusted code must run it in the
code-execution sandbox, as :func:`grpo_lightning.agents.python_tool.python` does.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

from transformers.utils import get_json_schema

from grpo_lightning.agents.tool_calls import ToolCall, import_object
from grpo_lightning.errors import ConfigError

#: The kinds of failed tool calls, as counted (``agent/tool_errors/<kind>``).
TOOL_ERROR_KINDS = ("bad_call", "unknown_tool", "bad_arguments", "tool_exception", "timeout")


def resolve_tools(tools: Sequence[str | Callable]) -> dict[str, Callable]:
    """Tools by name, from callables or import paths; a :class:`ConfigError` for one without a schema."""
    resolved = {}
    for tool in tools:
        function = import_object(tool, "tools") if isinstance(tool, str) else tool
        tool_schema(function)  # fails early for a tool the chat template could not describe
        resolved[function.__name__] = function
    return resolved


def tool_schema(function: Callable) -> dict[str, Any]:
    """The function's JSON schema, as chat templates take it in ``tools=``: its ``json_schema``
    attribute where it has one (a tool of another library, described by that library), else read
    from its type hints and docstring."""
    if isinstance(getattr(function, "json_schema", None), dict):
        return function.json_schema
    try:
        return get_json_schema(function)
    except Exception as error:  # noqa: BLE001 - transformers raises its own error types for each gap
        raise ConfigError(
            f"tools: {getattr(function, '__name__', function)!r} has no schema ({error}); give it type hints and a "
            "docstring with an 'Args:' line for each argument."
        ) from None


def run_tool_call(call: ToolCall, tools: dict[str, Callable], timeout: float) -> tuple[str, str | None]:
    """``(what the model reads, error kind or None)`` for one call (:data:`TOOL_ERROR_KINDS`)."""
    if call.error is not None:
        return f"Error: {call.error}.", "bad_call"
    function = tools.get(call.name)
    if function is None:
        return f"Error: there is no tool {call.name!r}; the tools are {', '.join(sorted(tools)) or 'none'}.", "unknown_tool"
    try:
        inspect.signature(function).bind(**call.arguments)
    except TypeError as error:
        return f"Error: wrong arguments for {call.name}: {error}.", "bad_arguments"
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = function(**call.arguments)
        except Exception as error:  # noqa: BLE001 - the model is told what its call raised
            outcome["error"] = error

    worker = threading.Thread(target=run, daemon=True, name=f"tool-{call.name}")
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return f"Error: {call.name} took longer than {timeout:g} s.", "timeout"
    if "error" in outcome:
        error = outcome["error"]
        return f"Error: {call.name} raised {type(error).__name__}: {error}", "tool_exception"
    return str(outcome["value"]), None
