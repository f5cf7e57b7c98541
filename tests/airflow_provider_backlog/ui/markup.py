"""What a rendered page holds, found by the ids and ``data-`` attributes its marks carry."""

from __future__ import annotations

from dataclasses import dataclass
from html.parser import HTMLParser

#: HTML elements without an end tag (the SVG the pages write closes every element).
_VOID = {"br", "hr", "img", "input", "link", "meta", "wbr", "col", "area", "base", "source"}


@dataclass(frozen=True)
class Element:
    tag: str
    attributes: dict[str, str | None]
    #: The ids of the element and of every element around it.
    within: tuple[str, ...]
    text: str


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[Element] = []
        self._open: list[tuple[str, str | None, int]] = []
        self._texts: list[list[str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        ids = tuple(i for _, i, _ in self._open if i) + (
            (attributes["id"],) if attributes.get("id") else ()
        )
        self.elements.append(Element(tag, attributes, ids, ""))
        if tag == "br":
            self.handle_data("\n")
        if tag not in _VOID:
            self._open.append((tag, attributes.get("id"), len(self.elements) - 1))
            self._texts.append([])

    def handle_endtag(self, tag: str) -> None:
        open_tag, _, index = self._open.pop()
        assert open_tag == tag, f"</{tag}> closes <{open_tag}>"
        text = "".join(self._texts.pop())
        element = self.elements[index]
        self.elements[index] = Element(element.tag, element.attributes, element.within, text)
        if self._texts:
            self._texts[-1].append(text)

    def handle_data(self, data: str) -> None:
        if self._texts:
            self._texts[-1].append(data)


def elements(html: str) -> list[Element]:
    """Every element of ``html``, in document order, with its text (its children's too; a
    line break is white space, as a browser shows it)."""
    parser = _Parser()
    parser.feed(html)
    parser.close()
    assert not parser._open, f"unclosed: {parser._open}"
    return parser.elements


def marked(html: str, attribute: str, within: str | None = None) -> list[str]:
    """The values of ``attribute`` on the elements carrying it (inside the element with id
    ``within``, when given), in document order."""
    return [
        str(element.attributes[attribute])
        for element in elements(html)
        if attribute in element.attributes and (within is None or within in element.within)
    ]


def by_id(html: str, id: str) -> Element:
    (found,) = [element for element in elements(html) if element.attributes.get("id") == id]
    return found


def cells(html: str, table_id: str) -> list[list[str]]:
    """The text of each body cell of a table, row by row, its white space collapsed."""
    rows: list[list[str]] = []
    for element in elements(html):
        if table_id in element.within and element.tag == "tr":
            rows.append([])
        elif table_id in element.within and element.tag == "td":
            rows[-1].append(" ".join(element.text.split()))
    return [row for row in rows if row]


def links(html: str) -> dict[str, dict[str, str | None]]:
    """Each link's attributes, by its text."""
    return {" ".join(e.text.split()): e.attributes for e in elements(html) if e.tag == "a"}
