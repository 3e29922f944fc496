"""Readable text of an HTML page: the title, and the text of the body without
scripts, styles, navigation and other chrome, one block element per paragraph."""

import re
from html.parser import HTMLParser

SKIP = {"script", "style", "noscript", "template", "svg", "head", "nav", "footer", "aside",
        "form", "iframe", "canvas", "button", "select"}
BLOCK = {"p", "div", "section", "article", "main", "header", "li", "ul", "ol", "table", "tr",
         "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "br", "hr", "dd", "dt", "td",
         "th", "figcaption"}
VOID = {"br", "hr", "img", "input", "meta", "link", "area", "base", "col", "embed", "source",
        "track", "wbr"}


class _Text(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title: list[str] = []
        self.skipping: list[str] = []
        self.in_title = False

    def handle_starttag(self, tag, attrs):
        if tag == "title":
            self.in_title = True
        if tag in SKIP and tag not in VOID:
            self.skipping.append(tag)
        if tag in BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag == "title":
            self.in_title = False
        if self.skipping and self.skipping[-1] == tag:
            self.skipping.pop()
        if tag in BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if self.in_title:
            self.title.append(data)
        elif not self.skipping:
            self.parts.append(data)


def readable_text(html: str) -> tuple[str, str]:
    parser = _Text()
    parser.feed(html)
    parser.close()
    lines = [re.sub(r"[ \t\r\f\v]+", " ", line).strip() for line in "".join(parser.parts).split("\n")]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return " ".join("".join(parser.title).split()), text
