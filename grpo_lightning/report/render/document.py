"""A small document model (headings, paragraphs, lists, tables, images, foldable sections),
written once by the report and rendered by ``markdown.render_markdown`` and ``html.render_html``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field


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
