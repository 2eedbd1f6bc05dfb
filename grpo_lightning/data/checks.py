"""Checks of data files and rows: bad data fails naming the file and line, or the split and row, and
the fix, before any step.

- a ``.json``/``.jsonl``/``.csv`` file whose bytes are not UTF-8, or a JSON-lines line that is not
  one JSON object or is nested too deeply to read: :func:`check_text_file`;
- a missing or empty prompt, or one that is neither text nor chat messages: :func:`check_prompts`;
- a prompt that does not fit the model's context with ``max_new_tokens``: :func:`fit_prompts`,
  as ``data.long_prompts`` says: ``"error"`` (default), ``"truncate"`` (keep the prompt's end: the
  question a chat model answers) or ``"skip"`` (drop the row), counted in one warning per split.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from grpo_lightning.errors import ConfigError

#: Values of ``data.long_prompts``: what a prompt too long for the model's context does.
LONG_PROMPTS = ("error", "truncate", "skip")
#: What each line of a JSON-lines file must be.
JSON_LINE_HINT = 'each line must be one JSON object, e.g. {"prompt": "What is 2+2?", "answer": "4"}'


def check_text_file(path: str, field: str) -> None:
    """Raise :class:`ConfigError` for a text data file (``.json``, ``.jsonl``, ``.csv``) that is
    empty, has bytes that are not UTF-8, or (JSON lines) a line that is not one JSON object; each
    error names the file and the line."""
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1) + 1
        raise ConfigError(
            f"{field}={path!r} line {line}: byte {raw[error.start]:#04x} at column {column} is not UTF-8; "
            "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 IN > OUT)."
        ) from None
    if not text.strip():
        raise ConfigError(f"{field}={path!r} is empty: it has no rows; add rows or point at another file.")
    extension = os.path.splitext(path)[1].lower()
    if extension == ".json":
        try:
            json.loads(text)
            return  # one JSON document (a list of rows)
        except RecursionError:
            raise ConfigError(
                f"{field}={path!r}: JSON nested too deeply to read (more levels than Python's JSON reader "
                "allows); flatten the nested values, or give one JSON object per line."
            ) from None
        except json.JSONDecodeError as error:
            if text.lstrip().startswith("["):
                raise ConfigError(
                    f"{field}={path!r} line {error.lineno}: not valid JSON ({error.msg} at column {error.colno}); "
                    "give a list of JSON objects, or one JSON object per line."
                ) from None
    if extension in (".json", ".jsonl"):
        _check_json_lines(text, path, field)


def _check_json_lines(text: str, path: str, field: str) -> None:
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            problem = f"not valid JSON ({error.msg} at column {error.colno})"
            raise ConfigError(f"{field}={path!r} line {number}: {problem}; {JSON_LINE_HINT}.") from None
        except RecursionError:
            problem = "JSON nested too deeply to read (more levels than Python's JSON reader allows)"
            raise ConfigError(f"{field}={path!r} line {number}: {problem}; flatten its nested values.") from None
        if not isinstance(row, dict):
            raise ConfigError(
                f"{field}={path!r} line {number}: a JSON {type(row).__name__}, not an object; {JSON_LINE_HINT}."
            )


def _is_empty(prompt: Any) -> bool:
    if isinstance(prompt, str):
        return not prompt.strip()
    if isinstance(prompt, list):
        contents = [message.get("content") if isinstance(message, dict) else message for message in prompt]
        return all(content is None or isinstance(content, str) and not content.strip() for content in contents)
    return prompt is None


def _message_problem(message: Any) -> str | None:
    """What makes ``message`` no chat message (a dict with a text ``role`` and a text or list
    ``content``), or ``None``. Rows of one column share their keys, so a message missing one holds
    ``None`` there."""
    if not isinstance(message, dict):
        return f"is {_a(type(message).__name__)}, not a chat message"
    role = message.get("role")
    if not isinstance(role, str) or not role.strip():
        return "has no 'role'"
    if not isinstance(message.get("content"), (str, list)):
        return "has no text 'content'"
    return None


def _prompt_problem(prompt: Any) -> str | None:
    """What is wrong with ``prompt`` as a prompt (``"an empty prompt"``, ...), or ``None``."""
    if prompt is None:
        return "no prompt"
    if isinstance(prompt, list):
        for index, message in enumerate(prompt):
            problem = _message_problem(message)
            if problem is not None:
                return f"a list prompt (its message {index} {problem})"
    elif not isinstance(prompt, str):
        return _a(type(prompt).__name__)
    return "an empty prompt" if _is_empty(prompt) else None


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def check_prompts(prompts: Sequence[Any], column: str, where: str) -> None:
    """Raise :class:`ConfigError` naming the first row (0-based) of ``prompts`` (column ``column`` of
    ``where``, e.g. ``"split 'train'"``) that is missing, empty or neither text nor a list of chat
    messages, and how many rows are: a bad prompt fails here, not inside the chat template once
    the model is loaded."""
    problems = [(i, problem) for i, prompt in enumerate(prompts) if (problem := _prompt_problem(prompt)) is not None]
    if not problems:
        return
    row, what = problems[0]
    more = f" (and {len(problems) - 1} more rows)" if len(problems) > 1 else ""
    raise ConfigError(
        f"{where}: row {row} (0-based){more} has {what} in column {column!r}; a prompt is text or a list of "
        'chat messages like {"role": "user", "content": "..."}: fill in or remove those rows.'
    )


def fit_prompts(
    dataset: Any,
    column: str,
    tokenizer: Any,
    format_prompt: Callable[[Any], str],
    context: int | None,
    max_new_tokens: int,
    handling: str,
    split: str,
) -> Any:
    """``dataset`` with every prompt of ``column`` (as ``format_prompt`` writes it) fitting the model's
    ``context`` with ``max_new_tokens`` to spare (``None``: unknown, nothing checked): ``handling`` is
    ``"error"`` (raise, naming the longest row), ``"truncate"`` (:func:`truncate_prompt`) or
    ``"skip"`` (drop the rows); both warn once with the count. Returns ``dataset`` itself when all fit."""
    if context is None:
        return dataset
    budget = context - max_new_tokens
    if budget < 1:
        raise ConfigError(
            f"sampling.max_new_tokens: {max_new_tokens} leaves no room for a prompt in the model context of {context} tokens; "
            "lower --model.sampling.max_new_tokens (and --model.evaluation.max_new_tokens)."
        )
    prompts = list(dataset[column])
    lengths = token_counts(tokenizer, [format_prompt(p) for p in prompts])
    long = [i for i, n in enumerate(lengths) if n > budget]
    if not long:
        return dataset
    limit = f"{budget} tokens (the model context of {context} minus max_new_tokens={max_new_tokens})"
    if handling == "error":
        longest = max(long, key=lengths.__getitem__)
        raise ConfigError(
            f"{len(long)} of {len(prompts)} prompts of the {split} split are longer than {limit}; the longest, row "
            f"{longest}, has {lengths[longest]}. Give --data.long_prompts truncate (keep each prompt's end) or skip "
            "(drop those rows), lower --model.sampling.max_new_tokens, or filter long prompts from the dataset."
        )
    if handling == "skip":
        if len(long) == len(prompts):
            raise ConfigError(
                f"data.long_prompts: every prompt of the {split} split is longer than {limit}; "
                "lower --model.sampling.max_new_tokens or give shorter prompts."
            )
        rank_zero_warn(
            f"data.long_prompts=skip: dropped {len(long)} of {len(prompts)} prompts of the {split} split "
            f"longer than {limit}."
        )
        dropped = set(long)
        return dataset.select([i for i in range(len(prompts)) if i not in dropped])
    for i in long:
        prompts[i] = truncate_prompt(prompts[i], tokenizer, format_prompt, budget, f"row {i} of the {split} split")
    rank_zero_warn(
        f"data.long_prompts=truncate: cut {len(long)} of {len(prompts)} prompts of the {split} split to "
        f"their last {limit}."
    )
    return dataset.map(lambda _, i: {column: prompts[i]}, with_indices=True, keep_in_memory=True)


def token_counts(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """Tokens of each text, without special tokens (as the rollout tokenizes formatted prompts)."""
    return [len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]] if texts else []


def truncate_prompt(prompt: Any, tokenizer: Any, format_prompt: Callable[[Any], str], budget: int, where: str) -> Any:
    """``prompt`` cut from its start until its formatted text has at most ``budget`` tokens: a text
    prompt keeps its last tokens; a chat keeps its other messages whole and the end of its last."""
    chat = isinstance(prompt, list)
    text = prompt[-1].get("content") if chat and isinstance(prompt[-1], dict) else prompt
    if not isinstance(text, str):
        raise ConfigError(
            f"data.long_prompts: truncate cuts text, and the last message of {where} has no text content; "
            "give --data.long_prompts skip."
        )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]

    def keeping(kept: int) -> Any:
        end = tokenizer.decode(ids[len(ids) - kept :]) if kept > 0 else ""
        return [*prompt[:-1], {**prompt[-1], "content": end}] if chat else end

    def count(candidate: Any) -> int:
        return token_counts(tokenizer, [format_prompt(candidate)])[0]

    kept = min(len(ids), max(budget - count(keeping(0)), 0))  # what the template (and other messages) leave
    candidate = keeping(kept)
    while kept > 0 and count(candidate) > budget:  # tokens can merge differently at the cut
        kept -= 1
        candidate = keeping(kept)
    if count(candidate) > budget:
        raise ConfigError(
            f"data.long_prompts: {where} does not fit in {budget} tokens even with its last message emptied (its "
            "template or other messages are longer); give --data.long_prompts skip."
        )
    return candidate
