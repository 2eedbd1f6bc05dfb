"""Markdown rendering of a report ``Doc`` (GitHub-flavoured tables; foldable sections as ``<details>``)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from grpo_lightning.report.render.document import Doc


def render_markdown(doc: Doc) -> str:
    return "\n\n".join(doc.render(MARKDOWN)) + "\n"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    lines = ["| " + " | ".join(_cell(c) for c in header) + " |"]
    lines.append("|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|")
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _details(summary: str, body: Doc) -> str:
    return f"<details><summary>{escape(summary)}</summary>\n\n{render_markdown(body).rstrip()}\n\n</details>"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


MARKDOWN = {
    "h": lambda level, text: "#" * level + " " + text,
    "p": lambda text: text,
    "ul": lambda items: "\n".join(f"- {item}" for item in items),
    "table": _table,
    "img": lambda alt, src: f"![{alt}]({src})",
    "details": _details,
}
