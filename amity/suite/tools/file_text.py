"""`file:text`: the text of the one uploaded file the request names in the tool's
`files` (a Files API id of the caller's team): a `.txt` file as UTF-8, a `.pdf`
through pypdf, page by page. The spec allows one file per request ("only one file"),
so more is a 422 at the route."""

import io

from pypdf import PdfReader
from pypdf.errors import PdfReadError

from amity.suite.tools.base import BuiltinTool, ToolContext, ToolError, ToolOutput, text_output

MAX_FILE_BYTES = 20 << 20
MAX_TEXT_CHARS = 50_000
MAX_PAGES = 500


def pdf_text(data: bytes) -> str:
    try:
        reader = PdfReader(io.BytesIO(data))
        pages = reader.pages[:MAX_PAGES]
        return "\n\n".join((page.extract_text() or "").strip() for page in pages)
    except (PdfReadError, ValueError, KeyError, TypeError) as error:
        raise ToolError("unreadable_file", f"the PDF cannot be read: {error}") from None


def extract(name: str, data: bytes) -> str:
    if name.lower().endswith(".pdf") or data.startswith(b"%PDF-"):
        return pdf_text(data)
    if name.lower().endswith(".txt"):
        return data.decode("utf-8", "replace")
    raise ToolError("unsupported_file", f"file:text reads .txt and .pdf files, not {name!r}")


def run(args: dict, context: ToolContext) -> ToolOutput:
    if not context.file_ids:
        raise ToolError("invalid_arguments", "the file:text tool names no file in `files`")
    if context.files is None:
        raise ToolError("files_unavailable", "there is no file store")
    file_id = context.file_ids[0]
    name, data = context.files.read(file_id, MAX_FILE_BYTES)
    return text_output({"file": name}, extract(name, data), MAX_TEXT_CHARS)


TOOL = BuiltinTool(
    type="file:text",
    description="Read the text of the file the user attached (.txt or .pdf).",
    parameters={"type": "object", "properties": {}},
    run=run,
)
