"""The chat message that environments, tools and chat templates exchange: ``{"role": ..., "content": ...}``."""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]


def prompt_messages(prompt: Any) -> list[Message]:
    """A row's prompt as messages: text is one user message, a list of messages is copied."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt or ()]


def followed_by(messages: list[Message], text: Any) -> list[Message]:
    """``messages`` with ``text`` (an environment's first observation) after them: appended to the last
    message where it is the user's, else a user message of its own; nothing for ``None`` or ``""``."""
    if text is None or text == "":
        return messages
    if messages and messages[-1].get("role") == "user":
        last = str(messages[-1].get("content") or "")
        return [*messages[:-1], {**messages[-1], "content": f"{last}\n\n{text}" if last else str(text)}]
    return [*messages, {"role": "user", "content": str(text)}]
