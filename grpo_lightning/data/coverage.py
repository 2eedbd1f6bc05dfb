"""Whether the tokenizer reads the prompts: a prompt that loses characters to the tokenizer (no
token for them, or a decode that differs from the text) reaches the model as other text, and a
task it cannot read does not learn. A fit warns once, naming an example, before its first step.

Harmless differences are not losses: whitespace (a prefix space, collapsed runs), Unicode
compatibility forms (NFKC) and special tokens written in the text (a chat template's) read back as
they are. A split is read from at most :data:`SAMPLED_PROMPTS` rows, spread evenly over it.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

#: Most rows of a split whose prompts are read back through the tokenizer.
SAMPLED_PROMPTS = 256
#: Longest example shown in the warning, in characters.
SHOWN_CHARACTERS = 80


def sampled_rows(count: int, limit: int = SAMPLED_PROMPTS) -> list[int]:
    """Up to ``limit`` row indices spread evenly over ``count`` rows, first and last included."""
    if count <= limit:
        return list(range(count))
    return sorted({round(i * (count - 1) / (limit - 1)) for i in range(limit)})


def _comparable(text: str) -> str:
    return "".join(ch for ch in unicodedata.normalize("NFKC", text) if not ch.isspace())


def read_back(tokenizer: Any, texts: Sequence[str]) -> list[str]:
    """Each text as the model receives it: encoded as the rollout does (no special tokens added),
    then decoded with unknown tokens left out (their characters are lost)."""
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
    unknown = getattr(tokenizer, "unk_token_id", None)
    kept = [[i for i in row if i != unknown] for row in ids]
    return tokenizer.batch_decode(kept, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def lost_characters(text: str, read: str) -> str:
    """The characters of ``text`` missing from ``read`` (each once, in order), ignoring whitespace and
    Unicode compatibility forms."""
    missing = Counter(_comparable(text)) - Counter(_comparable(read))
    return "".join(dict.fromkeys(ch for ch in _comparable(text) if ch in missing))


def lost_prompt_characters(
    prompts: Sequence[Any], tokenizer: Any, format_prompt: Callable[[Any], str], rows: Sequence[int] | None = None
) -> list[tuple[int, str, str, str]]:
    """``(row, text, read, lost)`` for each of ``prompts`` (``rows``: their row numbers, by default
    their positions) that loses characters, where ``text`` is the formatted prompt and ``read`` what
    the model receives."""
    texts = [format_prompt(prompt) for prompt in prompts]
    found = []
    for row, text, read in zip(rows or range(len(texts)), texts, read_back(tokenizer, texts)):
        lost = lost_characters(text, read)
        if lost:
            found.append((row, text, read, lost))
    return found


def _shown(text: str) -> str:
    return repr(text if len(text) <= SHOWN_CHARACTERS else text[: SHOWN_CHARACTERS - 3] + "...")


def warn_lost_characters(
    splits: dict[str, Any], column: str, tokenizer: Any, format_prompt: Callable[[Any], str]
) -> bool:
    """Warn once (rank zero) for the first of ``splits`` (``{name: Dataset}``) whose sampled prompts
    lose characters to the tokenizer, naming a row, what the model receives and what it loses.
    Returns whether it warned."""
    for split, dataset in splits.items():
        if dataset is None or len(dataset) == 0:
            continue
        rows = sampled_rows(len(dataset))  # a column of a large dataset is not read whole
        lossy = lost_prompt_characters(dataset.select(rows)[column], tokenizer, format_prompt, rows)
        if not lossy:
            continue
        row, text, read, lost = lossy[0]
        checked = len(rows)
        rank_zero_warn(
            f"data: the tokenizer loses characters of {len(lossy)} of {checked} prompts checked in the {split} "
            f"split, so the model never sees them: row {row}, {_shown(text)}, reaches it as {_shown(read)} "
            f"(lost: {_shown(lost)}). Give --model.model (or --model.policy.tokenizer) a model whose tokenizer covers "
            "your data; the quickstart's tiny model reads printable ASCII only (docs/bring_your_own)."
        )
        return True
    return False
