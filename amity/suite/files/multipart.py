"""Reading a multipart/form-data body as it arrives: small fields into memory, the one
file part straight into a sink (a file on disk, hashed on the way), so an upload
never sits whole in memory and its size limit holds while it streams."""

from typing import Callable, Protocol

from fastapi import Request
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from amity.suite.errors import ApiError

MAX_FIELD_BYTES = 64 * 1024


class Sink(Protocol):
    def write(self, data: bytes) -> None: ...


def _bad_form(msg: str) -> ApiError:
    return ApiError(422, msg, loc=("body",), type="invalid_form")


class _FormReader:
    def __init__(self, file_field: str, open_sink: Callable[[dict, str | None], Sink]):
        self.file_field, self.open_sink = file_field, open_sink
        self.fields: dict[str, str] = {}
        self.seen_file = False
        self._headers: dict[str, str] = {}
        self._header_name = self._header_value = b""
        self._name = ""
        self._buffer = bytearray()
        self._sink: Sink | None = None

    def on_part_begin(self) -> None:
        self._headers, self._buffer, self._sink = {}, bytearray(), None

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        self._headers[self._header_name.decode("latin-1").lower()] = self._header_value.decode("latin-1")
        self._header_name = self._header_value = b""

    def on_headers_finished(self) -> None:
        _, params = parse_options_header(self._headers.get("content-disposition", ""))
        self._name = params.get(b"name", b"").decode("utf-8", "replace")
        if self._name == self.file_field:
            if self.seen_file:
                raise _bad_form(f"send one `{self.file_field}` part, not several")
            self.seen_file = True
            filename = params.get(b"filename")
            self._sink = self.open_sink(dict(self.fields),
                                        filename.decode("utf-8", "replace") if filename else None)

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._sink is not None:
            self._sink.write(data[start:end])
            return
        self._buffer += data[start:end]
        if len(self._buffer) > MAX_FIELD_BYTES:
            raise _bad_form(f"form field {self._name!r} is longer than {MAX_FIELD_BYTES} bytes")

    def on_part_end(self) -> None:
        if self._sink is None:
            try:
                self.fields[self._name] = self._buffer.decode()
            except UnicodeDecodeError:
                raise _bad_form(f"form field {self._name!r} is not UTF-8") from None
        self._sink = None


async def read_form(request: Request, file_field: str,
                    open_sink: Callable[[dict, str | None], Sink]) -> dict[str, str]:
    """Stream the body; `open_sink(fields so far, filename)` receives the file part.
    Returns the text fields. No file part is a 422."""
    content_type, params = parse_options_header(request.headers.get("content-type", ""))
    if content_type != b"multipart/form-data" or not params.get(b"boundary"):
        raise _bad_form("send the body as multipart/form-data with a boundary")
    reader = _FormReader(file_field, open_sink)
    parser = MultipartParser(params[b"boundary"], {
        name: getattr(reader, name) for name in (
            "on_part_begin", "on_header_field", "on_header_value", "on_header_end",
            "on_headers_finished", "on_part_data", "on_part_end")})
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
    except MultipartParseError as error:
        raise _bad_form(f"the multipart body could not be read: {error}") from None
    if not reader.seen_file:
        raise ApiError(422, f"the form has no `{file_field}` part", loc=("body", file_field),
                       type="missing")
    return reader.fields
