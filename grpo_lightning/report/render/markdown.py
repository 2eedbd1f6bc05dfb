"""Markdown rendering of a report ``Doc`` (GitHub-flavoured tables; foldable sections as ``<details>``).

A user's text (:func:`~grpo_lightning.report.render.document.user_text`) shows as its characters: in
a code span, with backticks as ``'`` and line breaks as ``⏎``; elsewhere, with ``& < > |`` as HTML
entities (no raw HTML, no table cell ended), line breaks as spaces, and backslashes before the
characters that would start emphasis, a link, a code span, a heading's end or math (``_`` only at a
word's edge, where it can)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from html import escape

from grpo_lightning.report.render.document import Doc, plain_text, resolve_user_text

LINE_BREAK = re.compile(r"\r\n|\r|\n")
MARKUP_CHARACTER = re.compile(r"[\\`*\[\]~#$]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "&#124;"}


def render_markdown(doc: Doc) -> str:
    return "\n\n".join(doc.render(MARKDOWN)) + "\n"


def markdown_text(text: str) -> str:
    """A user's text outside a code span, as Markdown that shows exactly its characters."""
    escaped = MARKUP_CHARACTER.sub(lambda match: "\\" + match.group(), LINE_BREAK.sub(" ", text))
    return re.sub("[&<>|]", lambda match: ENTITIES[match.group()], escaped)


def code_span_text(text: str) -> str:
    """A user's text inside a code span, where nothing is markup but a backtick ends the span."""
    return LINE_BREAK.sub("⏎", text).replace("`", "'")


def _text(text: str) -> str:
    return resolve_user_text(str(text), lambda held: held, markdown_text, code_span_text)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    lines = ["| " + " | ".join(_cell(c) for c in header) + " |"]
    lines.append("|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|")
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _details(summary: str, body: Doc) -> str:
    return f"<details><summary>{escape(plain_text(summary))}</summary>\n\n{render_markdown(body).rstrip()}\n\n</details>"


def _cell(text: str) -> str:
    """A table cell: the report's own ``|`` and line breaks escaped too (a user's text has none left)."""
    return _text(text).replace("|", "\\|").replace("\n", " ")


MARKDOWN = {
    "h": lambda level, text: "#" * level + " " + _text(text),
    "p": _text,
    "ul": lambda items: "\n".join(f"- {_text(item)}" for item in items),
    "table": _table,
    "img": lambda alt, src: f"![{_text(alt)}]({src})",
    "details": _details,
}
