"""HTML rendering of a report ``Doc``: one self-contained page with its stylesheet inline."""

from __future__ import annotations

import re
from collections.abc import Sequence
from html import escape

from grpo_lightning.report.render.document import Doc, plain_text, resolve_user_text

CSS = """body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; vertical-align: top; }
th { background: #f3f3f3; }
td.num, th.num { text-align: right; }
code { background: #f3f3f3; padding: 0 0.2em; }
img { max-width: 100%; }
details { margin: 1em 0; }
"""


def render_html(doc: Doc, title: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(plain_text(title))}</title>\n<style>\n{CSS}</style>\n</head>\n<body>\n{_body(doc)}</body>\n</html>\n"
    )


def _body(doc: Doc) -> str:
    return "\n".join(doc.render(HTML)) + "\n"


def _heading(level: int, text: str) -> str:
    anchor = re.sub(r"[^a-z0-9]+", "-", plain_text(text).lower()).strip("-")
    return f'<h{level} id="{anchor}">{_inline(text)}</h{level}>'


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    style = ["" if a == "l" else ' class="num"' for a in align]
    lines = [
        "<table>",
        "<thead><tr>" + "".join(f"<th{s}>{_inline(c)}</th>" for c, s in zip(header, style)) + "</tr></thead>",
        "<tbody>",
    ]
    lines += ["<tr>" + "".join(f"<td{s}>{_inline(c)}</td>" for c, s in zip(row, style)) + "</tr>" for row in rows]
    lines += ["</tbody>", "</table>"]
    return "\n".join(lines)


def _inline(text: str) -> str:
    """Escaped text with Markdown's ``code``, **bold** and [links](target) as HTML; nothing inside
    a code span, nor a user's text, is read as markup."""
    return resolve_user_text(str(text), _code_and_markup, _text_only, _text_only)


def _text_only(text: str) -> str:
    return escape(text, quote=False)


def _code_and_markup(text: str) -> str:
    parts = re.split(r"(`[^`]+`)", text)
    return "".join(
        f"<code>{escape(part[1:-1], quote=False)}</code>" if part.startswith("`") and len(part) > 1 else _markup(part)
        for part in parts
    )


def _markup(text: str) -> str:
    escaped = escape(text, quote=False)
    escaped = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)
    return re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", lambda m: f'<a href="{escape(m.group(2))}">{m.group(1)}</a>', escaped)


HTML = {
    "h": _heading,
    "p": lambda text: f"<p>{_inline(text)}</p>",
    "ul": lambda items: "<ul>\n" + "".join(f"<li>{_inline(i)}</li>\n" for i in items) + "</ul>",
    "table": _table,
    "img": lambda alt, src: f'<p><img src="{escape(src)}" alt="{escape(plain_text(alt))}"></p>',
    "details": lambda summary, body: f"<details><summary>{escape(plain_text(summary))}</summary>\n{_body(body)}</details>",
}
