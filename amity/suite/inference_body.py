"""What the Suite reads of an inference body (dedicated or serverless): its `model`,
and the body to forward (`read_inference_body`).

A JSON body is read whole (it is small; `model` may be anywhere in it) and, for the
streamable operations, gets the one rewrite of platform-notes §0.3 (accept.py): no
`stream` field and an Accept header preferring `text/event-stream` over JSON ->
`"stream": true`. A dedicated image request is translated to the container's shape
(dedicated_images.py), and its answer back.

A multipart/form-data body (an audio file) is not read whole: its chunks are parsed as
they arrive until the `model` field is complete (clients send it before the file, as
the SDKs do), and the body then goes on as the chunks that were read followed by the
rest of the stream, unchanged. The replica applies the Accept rule to a multipart
transcription itself (the Accept header goes with it).
"""

import json
from collections.abc import AsyncIterable, AsyncIterator, Callable

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from amity.suite import dedicated_images as images
from amity.suite.accept import wants_stream
from amity.suite.errors import ApiError

STREAMABLE = ("/v1/chat/completions", "/v1/completions", "/v1/audio/transcriptions")
# How far into a multipart body `model` is looked for: a client that sends it after a
# bigger file is told to send it first rather than having the Suite hold the file.
MODEL_FIELD_WITHIN_BYTES = 64 * 2**20


def missing_model(model_is: str) -> ApiError:
    return ApiError(422, f"`model` is required: {model_is}", loc=("body", "model"), type="missing")


def json_model(raw: bytes, path: str, accept: str, model_is: str) -> tuple[str, dict, bytes]:
    """(model, the parsed body, the bytes to forward) of a JSON body."""
    try:
        body = json.loads(raw)
    except ValueError:
        raise ApiError(422, "the body is not valid JSON", loc=("body",), type="json_invalid") from None
    if not isinstance(body, dict):
        raise ApiError(422, "the body is a JSON object", loc=("body",), type="model_attributes_type")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise missing_model(model_is)
    if path in STREAMABLE and "stream" not in body and wants_stream(None, accept):
        body["stream"] = True
        raw = json.dumps(body, ensure_ascii=False).encode()
    return model, body, raw


class _FieldReader:
    """Feeds multipart chunks to a parser and keeps the value of one text field."""

    def __init__(self, boundary: bytes, wanted: bytes):
        self.wanted, self.value, self.done = wanted, bytearray(), False
        self._field, self._value = bytearray(), bytearray()  # of the header being read
        self._name, self._in_wanted = None, False
        self.parser = MultipartParser(boundary, {
            "on_header_field": lambda d, s, e: self._field.extend(d[s:e]),
            "on_header_value": lambda d, s, e: self._value.extend(d[s:e]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._data,
            "on_part_end": self._part_end,
        })

    def _header_end(self) -> None:
        if bytes(self._field).strip().lower() == b"content-disposition":
            self._name = parse_options_header(bytes(self._value))[1].get(b"name")
        self._field.clear()
        self._value.clear()

    def _headers_finished(self) -> None:
        self._in_wanted = self._name == self.wanted
        self._name = None

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._in_wanted:
            self.value.extend(data[start:end])

    def _part_end(self) -> None:
        if self._in_wanted:
            self.done, self._in_wanted = True, False


async def multipart_model(content_type: str, stream: AsyncIterator[bytes],
                          model_is: str) -> tuple[str, AsyncIterable[bytes]]:
    """(model, the body to forward) of a multipart/form-data body arriving as `stream`."""
    boundary = parse_options_header(content_type)[1].get(b"boundary")
    if not boundary:
        raise ApiError(422, "a multipart body needs a boundary in its Content-Type",
                       loc=("header", "Content-Type"), type="value_error")
    try:
        reader = _FieldReader(boundary, b"model")
    except FormParserError as error:
        raise ApiError(422, str(error), loc=("header", "Content-Type"), type="value_error") from None
    read, size = [], 0
    async for chunk in stream:
        read.append(chunk)
        size += len(chunk)
        try:
            reader.parser.write(chunk)
        except FormParserError as error:
            raise ApiError(422, f"the multipart body is malformed: {error}", loc=("body",),
                           type="value_error") from None
        if reader.done:
            break
        if size > MODEL_FIELD_WITHIN_BYTES:
            raise ApiError(422, f"no `model` field in the first {MODEL_FIELD_WITHIN_BYTES // 2**20} "
                                "MiB of the form; send it before the file", loc=("body", "model"),
                           type="missing")
    model = reader.value.decode("utf-8", "replace")
    if not reader.done or not model:
        raise missing_model(model_is)

    async def body() -> AsyncIterator[bytes]:
        for chunk in read:
            yield chunk
        async for chunk in stream:
            yield chunk

    return model, body()


async def read_inference_body(request, path: str, model_is: str) -> tuple[
        str, bytes | AsyncIterable[bytes], Callable[[bytes], bytes] | None]:
    """(model, the body to forward, the rewrite of a 200 answer or None) of an inference
    request to `path`; `model_is` says what `model` names, for the error."""
    content_type = request.headers.get("content-type", "").lower()
    if content_type.startswith("multipart/form-data"):
        model, body = await multipart_model(request.headers["content-type"], request.stream(), model_is)
        return model, body, None
    if content_type and not content_type.startswith("application/json"):
        raise ApiError(415, "inference takes a JSON body (multipart/form-data for audio)",
                       loc=("header", "Content-Type"), type="unsupported_media_type")
    model, parsed, raw = json_model(await request.body(), path, request.headers.get("accept", ""),
                                    model_is)
    if path in images.IMAGE_PATHS:
        raw, asked = images.to_container(parsed)
        return model, raw, images.answer_rewriter(asked)
    return model, raw, None
