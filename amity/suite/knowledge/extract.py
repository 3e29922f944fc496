"""The text of a document: `.txt` and `.md` as UTF-8, `.pdf` through pypdf (the
file:text tool's reader)."""

from amity.suite.tools.base import ToolError
from amity.suite.tools.file_text import pdf_text

SUFFIXES = (".txt", ".md", ".pdf")


class UnreadableDocument(Exception):
    pass


def document_text(name: str, data: bytes) -> str:
    lowered = name.lower()
    if lowered.endswith(".pdf"):
        try:
            text = pdf_text(data)
        except ToolError as error:
            raise UnreadableDocument(str(error)) from None
    elif lowered.endswith((".txt", ".md")):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise UnreadableDocument(f"{name!r} is not UTF-8 text: {error}") from None
    else:
        raise UnreadableDocument(f"knowledge documents are {', '.join(SUFFIXES)} files, not {name!r}")
    text = text.replace("\x00", "")  # PostgreSQL cannot store a NUL in text
    if not text.strip():
        raise UnreadableDocument(f"{name!r} has no text")
    return text
