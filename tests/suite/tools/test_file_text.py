"""file:text reads one uploaded file of the caller's team: .txt as UTF-8, .pdf
through pypdf (a PDF written here byte by byte, with real text objects)."""

import pytest

from amity.suite.auth import Caller
from amity.suite.tools import file_text
from amity.suite.tools.base import ToolContext, ToolError, ToolSettings
from amity.suite.tools.files import StoreFiles
from tests.suite.flows import upload


def make_pdf(pages: list[str]) -> bytes:
    """A minimal PDF: one Helvetica text line per page, with a correct xref table."""
    count = len(pages)
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(count))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               f"<< /Type /Pages /Kids [{kids}] /Count {count} >>".encode()]
    font = 3 + 2 * count
    for i, text in enumerate(pages):
        stream = f"BT /F1 18 Tf 72 720 Td ({text}) Tj ET".encode()
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents "
                       f"{4 + 2 * i} 0 R /Resources << /Font << /F1 {font} 0 R >> >> >>".encode())
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def read(suite, account, file_ids):
    files = StoreFiles(suite.sessions, suite.client.app.state.objects,
                       Caller(account.user_id, account.team_id), None)
    return file_text.TOOL.run({}, ToolContext(ToolSettings(), files, file_ids)).result


def test_text_file(suite):
    file_id = upload(suite.client, suite.admin, "Grüße aus Seoul.\nLine two.".encode(), "notes.txt")
    assert read(suite, suite.admin, [file_id]) == {"file": "notes.txt",
                                                   "text": "Grüße aus Seoul.\nLine two."}


def test_pdf_file(suite):
    pdf = make_pdf(["The otter report", "Page two says 42"])
    file_id = upload(suite.client, suite.admin, pdf, "report.pdf")
    out = read(suite, suite.admin, [file_id])
    assert out["file"] == "report.pdf"
    assert out["text"] == "The otter report\n\nPage two says 42"


def test_refusals(suite):
    other_team_file = upload(suite.client, suite.other, b"theirs", "theirs.txt")
    binary = upload(suite.client, suite.admin, b"\x00\x01", "data.bin")
    broken = upload(suite.client, suite.admin, b"%PDF-1.4 not really", "broken.pdf")
    for ids, kind in (([other_team_file], "file_not_found"), (["file_nope"], "file_not_found"),
                      ([binary], "unsupported_file"), ([broken], "unreadable_file"),
                      ([], "invalid_arguments")):
        with pytest.raises(ToolError) as error:
            read(suite, suite.admin, ids)
        assert error.value.type == kind, ids
