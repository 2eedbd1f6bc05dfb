"""An environment of tools: the model calls them until it answers without a call."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from grpo_lightning.agents.messages import Message, prompt_messages
from grpo_lightning.agents.tool_calls import ToolCall, resolve_tool_call_format
from grpo_lightning.agents.tools import resolve_tools, run_tool_call


class ToolEnvironment:
    """The row's prompt opens the episode; each model turn with tool calls gets one ``tool`` message
    per call (a failed call's message says what went wrong, and is counted in ``tool_errors``); the
    first turn without one ends the episode, scored by :meth:`score`.

    Args:
        tools: callables with type hints and docstrings, or their import paths.
        tool_call_format: how calls are written (:data:`~grpo_lightning.agents.tool_calls.TOOL_CALL_FORMATS`,
            an import path or a callable ``text -> list[ToolCall]``).
        tool_timeout: seconds a call may run.
        max_tool_calls: calls run per turn at most; more are answered with an error.
    """

    def __init__(
        self,
        tools: Sequence[str | Callable] = (),
        tool_call_format: str | Callable[[str], list[ToolCall]] = "json_tags",
        tool_timeout: float = 5.0,
        max_tool_calls: int = 4,
    ) -> None:
        self.tool_functions = resolve_tools(tools)
        self.parse = resolve_tool_call_format(tool_call_format)
        self.tool_timeout = tool_timeout
        self.max_tool_calls = max_tool_calls
        self.row: dict[str, Any] = {}
        self.tool_calls = 0
        self.tool_errors: Counter[str] = Counter()

    @property
    def tools(self) -> list[Callable]:
        return list(self.tool_functions.values())

    def reset(self, row: dict[str, Any]) -> list[Message]:
        self.row = row
        return prompt_messages(row["prompt"])

    def step(self, message: Message) -> tuple[list[Message], float | None, bool]:
        calls = self.parse(message["content"])
        if not calls:
            return [], self.score(message["content"]), True
        replies = []
        for index, call in enumerate(calls):
            if index < self.max_tool_calls:
                content, error = run_tool_call(call, self.tool_functions, self.tool_timeout)
            else:
                content, error = f"Error: at most {self.max_tool_calls} tool calls per turn.", "bad_call"
            self.tool_calls += 1
            if error is not None:
                self.tool_errors[error] += 1
            replies.append({"role": "tool", "name": call.name, "content": content})
        return replies, None, False

    def score(self, answer: str) -> float | None:
        """The reward of the final answer; ``None``: left to the reward functions."""
        return None
