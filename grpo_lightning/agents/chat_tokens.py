"""Messages to token ids for multi-turn rollouts, without ever tokenising the model's turns again.

The prompt is rendered once. Each environment reply is rendered alone, as the text the chat template
puts after an assistant turn's end-of-sequence token (computed on a fixed two-message conversation),
and its ids are appended to the sampled ones: the trainer scores exactly the tokens the model sampled.
Without a chat template (or with ``use_chat_template`` off), messages are their contents, joined.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from grpo_lightning.agents.environment import Message
from grpo_lightning.agents.tools import tool_schema
from grpo_lightning.errors import ConfigError

#: The conversation an environment reply is rendered after (its text is cut away).
_BASE = [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]


def tools_instruction(schemas: list[dict[str, Any]]) -> str:
    """A system message that describes the tools, for chat templates that leave ``tools=`` out."""
    listed = "\n".join(json.dumps(schema) for schema in schemas)
    return (
        "You can call these tools, described as JSON schemas:\n" + listed + "\nTo call one, write "
        '<tool_call>{"name": <tool name>, "arguments": <arguments as a JSON object>}</tool_call> and end your turn.'
    )


class ChatTokens:
    """Renders one environment's messages for ``tokenizer``: the tools' schemas go to the chat
    template's ``tools=``, or, where the template ignores them, into a system message
    (:func:`tools_instruction`)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, tools: Sequence[Callable] = (), use_chat_template: bool = True):
        self.tokenizer = tokenizer
        self.templated = bool(use_chat_template and tokenizer.chat_template)
        self.schemas = [tool_schema(tool) for tool in tools] or None
        self.instruction = None
        if self.templated and self.schemas and self._render(_BASE, False, self.schemas) == self._render(_BASE, False, None):
            self.schemas, self.instruction = None, tools_instruction(self.schemas)
        self._after_turn = self._render(_BASE, False) if self.templated else ""
        eos = tokenizer.eos_token or ""
        self._cut = self._after_turn.rfind(eos) + len(eos) if eos else -1
        if self.templated and (not eos or self._cut < len(eos)):
            raise ConfigError(
                f"environment: the chat template does not end an assistant turn with the EOS token {eos!r}, where the "
                "model's turns stop; use a tokenizer whose EOS ends turns, or set --model.policy.use_chat_template false."
            )

    def _render(self, messages: list[Message], generation_prompt: bool, schemas: Any = "own") -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.schemas if schemas == "own" else schemas, tokenize=False,
            add_generation_prompt=generation_prompt,
        )  # fmt: skip

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """The opening messages, ending where the model's first turn starts."""
        if not self.templated:
            return self._encode("".join(str(m["content"]) for m in messages))
        if self.instruction is not None:
            if messages and messages[0]["role"] == "system":
                messages = [{**messages[0], "content": f"{messages[0]['content']}\n\n{self.instruction}"}, *messages[1:]]
            else:
                messages = [{"role": "system", "content": self.instruction}, *messages]
        return self._encode(self._render(messages, True))

    def reply_ids(self, messages: list[Message]) -> list[int]:
        """The environment's reply after a model turn that ended with EOS, up to the next turn's start."""
        if not self.templated:
            return self._encode("".join(str(m["content"]) for m in messages))
        after = self._render(_BASE + list(messages), True)
        if not after.startswith(self._after_turn[: self._cut]):
            raise ConfigError(
                "environment: the chat template renders earlier turns differently once a reply follows them, so a reply "
                "cannot be appended to the sampled tokens; set --model.policy.use_chat_template false or use another template."
            )
        return self._encode(after[self._cut :])
