"""Messages to token ids for multi-turn rollouts, without ever tokenising the model's turns again.

The prompt is rendered once. Each environment reply is rendered alone, as the text the chat template
puts after an assistant turn's end-of-sequence token (computed on a fixed two-message conversation),
and its ids are appended to the sampled ones: the trainer scores exactly the tokens the model sampled.
Without a chat template (or with ``use_chat_template`` off), messages are their contents, joined.

A reply's contents are tokenized as text: a tool that prints ``<|im_end|>`` gives the characters, never
the special token, so no role token enters the transcript through them; the template's own tokens
around them stay special.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from grpo_lightning.agents.messages import Message
from grpo_lightning.agents.tools import tool_schema
from grpo_lightning.errors import ConfigError

#: The conversation an environment reply is rendered after (its text is cut away).
_BASE = [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]
#: What stands for the ``i``-th reply's content while the template renders where contents go
#: (private-use characters, which no template writes).
_MARK = "\ue000{}\ue001"
_MARKS = re.compile("\ue000(\\d+)\ue001")
_SURROGATE = re.compile("[\ud800-\udfff]")


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

    def _encode_text(self, text: str) -> list[int]:
        """``text``'s ids with special-token text split into ordinary tokens."""
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

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
        """The environment's reply after a model turn that ended with EOS, up to the next turn's start;
        the messages' contents as text (:meth:`_encode_text`)."""
        contents = [valid_text(m.get("content", "")) for m in messages]
        messages = [{**m, "content": content} for m, content in zip(messages, contents)]
        if not self.templated:
            return self._encode_text("".join(contents))
        after = self._reply_text(messages)
        marked = self._reply_text([{**m, "content": _MARK.format(i)} for i, m in enumerate(messages)])
        pieces = _MARKS.split(marked)  # the template's text, then a content's index, and so on
        shown = {int(piece) for n, piece in enumerate(pieces) if n % 2}
        dropped = sorted({str(m.get("role")) for i, m in enumerate(messages) if contents[i] and i not in shown})
        if dropped:  # the model would never see them, and nothing would say so
            raise ConfigError(f"environment: the chat template leaves out messages of the roles {dropped}, so the model "
                              "would not see the environment's reply; use a template that renders them, or "
                              "--model.policy.use_chat_template false.")  # fmt: skip
        if "".join(contents[int(p)] if i % 2 else p for i, p in enumerate(pieces)) != after:
            # The template changes contents (quotes, trims): keep their text, drop special-token text from it.
            return self._encode(self._reply_text([{**m, "content": self._without_special_tokens(m["content"])} for m in messages]))
        return [i for n, p in enumerate(pieces) for i in (self._encode_text(contents[int(p)]) if n % 2 else self._encode(p))]

    def _reply_text(self, messages: list[Message]) -> str:
        """The rendered text of a reply after a turn's EOS, up to the next turn's start."""
        after = self._render(_BASE + list(messages), True)
        if not after.startswith(self._after_turn[: self._cut]):
            raise ConfigError(
                "environment: the chat template renders earlier turns differently once a reply follows them, so a reply "
                "cannot be appended to the sampled tokens; set --model.policy.use_chat_template false or use another template."
            )
        return after[self._cut :]

    def _without_special_tokens(self, text: str) -> str:
        special = [t.content for t in self.tokenizer.added_tokens_decoder.values() if t.special]
        while any(token in text for token in special):  # again: a removal can join the halves of another
            for token in special:
                text = text.replace(token, "")
        return text


def valid_text(content: object) -> str:
    """``content`` as text a tokenizer takes: lone surrogates (not UTF-8) become U+FFFD."""
    return _SURROGATE.sub("\ufffd", str(content))
