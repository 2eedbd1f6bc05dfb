"""A small document model (headings, paragraphs, lists, tables, images, foldable sections),
written once by the report and rendered by ``markdown.render_markdown`` and ``html.render_html``.

The report's own text is Markdown-flavoured (``**bold**``, ```code```, ``[links](target)``); text a
user chose (arm, run and sweep names, prompts, completions) enters it through :func:`user_text`
only, and each renderer escapes it for its format (:func:`resolve_user_text`), so that no such text
reads as markup there."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

USER_START, USER_END = "\ue000", "\ue001"  # private-use characters: no report text holds them
USER_TEXT = re.compile(f"{USER_START}([^{USER_END}]*){USER_END}")
HELD = re.compile(f"{USER_START}(\\d+){USER_END}")
CODE_SPAN = re.compile(r"(`[^`]+`)")


def user_text(text: object) -> str:
    """``text``, marked as a user's: rendered as the characters it holds, never as markup."""
    return USER_START + str(text).replace(USER_START, "").replace(USER_END, "") + USER_END


def plain_text(text: str) -> str:
    """``text`` with the marks of :func:`user_text` removed (for an escape that treats it all as text)."""
    return USER_TEXT.sub(r"\1", text)


def resolve_user_text(text: str, markup: Callable[[str], str], outside: Callable[[str], str],
                      in_code: Callable[[str], str]) -> str:  # fmt: skip
    """``markup`` applied to ``text`` (its code spans included), each user text in it held out of
    that and put back escaped: by ``in_code`` inside a code span, by ``outside`` elsewhere."""
    texts = USER_TEXT.findall(text)
    numbers = iter(range(len(texts)))
    held = USER_TEXT.sub(lambda _: f"{USER_START}{next(numbers)}{USER_END}", text)
    in_span = {int(i) for span in CODE_SPAN.findall(held) for i in HELD.findall(span)}
    escaped = [(in_code if i in in_span else outside)(t) for i, t in enumerate(texts)]
    return HELD.sub(lambda match: escaped[int(match.group(1))], markup(held))


@dataclass
class Doc:
    """Blocks ``(kind, *fields)``; a renderer maps each kind to a function of the fields."""

    blocks: list[tuple] = field(default_factory=list)

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", level, text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def items(self, items: Sequence[str]) -> None:
        self.blocks.append(("ul", list(items)))

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> None:
        self.blocks.append(("table", list(header), [list(r) for r in rows], align or "l" + "r" * (len(header) - 1)))

    def img(self, alt: str, src: str) -> None:
        self.blocks.append(("img", alt, src))

    def details(self, summary: str, body: Doc) -> None:
        self.blocks.append(("details", summary, body))

    def render(self, renderers: Mapping[str, Callable[..., str]]) -> list[str]:
        """Each block as text, by the renderer of its kind."""
        return [renderers[block[0]](*block[1:]) for block in self.blocks]
