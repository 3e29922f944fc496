"""The load generator's HTTP/1.1 client for streamed answers: lean, because it shares
the machine with the server it measures.

On a 2-core machine every microsecond the load generator spends on a streamed chunk is
taken from the server under test. httpx (h11, anyio and six async-generator layers per
chunk) took about 100 us a chunk at c=32; here an asyncio protocol feeds httptools' C
parser and hands each line of the answer to a callback inside `data_received`, about
30 us (benchmarks/README.md, "Served against offline"). A line is timed as it comes off
the socket. Connections are kept alive and reused, one per request in flight, as httpx's
unbounded pool does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time. While the answer is a 200, each
    complete line of its body (no line ending) goes to `on_line`; any other status's body
    is kept whole and returned with it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._done: asyncio.Future | None = None
        self._on_line: Callable[[bytes], None] | None = None

    # -- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._done is None or self._done.done():
            return  # nothing asked for it (the answer already failed)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as error:  # `on_line` raised: that error
            self._fail(error.__context__ or error)
        except Exception as error:  # noqa: BLE001 - not HTTP: the request's failure
            self._fail(error)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._done is not None and not self._done.done():
            if self._status is not None and self._until_close:
                self.on_message_complete()  # a body without length or chunks ends here
            else:
                self._done.set_exception(exc or ConnectionError("the server closed the connection"))

    # -- httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._until_close = False

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self._status != 200:
            self._body.append(body)
            return
        if b"\n" not in body:
            self._partial += body
            return
        *lines, self._partial = (self._partial + body).split(b"\n")
        for line in lines:
            self._on_line(line.removesuffix(b"\r"))

    def on_message_complete(self) -> None:
        if self._partial and self._status == 200:
            self._on_line(self._partial.removesuffix(b"\r"))
        if not self._parser.should_keep_alive():
            self.transport.close()
            self.closed = True
        if not self._done.done():
            self._done.set_result((self._status, b"".join(self._body)))

    def _fail(self, error: Exception) -> None:
        self.transport.close()
        self.closed = True
        self._done.set_exception(error)

    async def request(self, head: bytes, payload: bytes, on_line: Callable[[bytes], None]
                      ) -> tuple[int, bytes]:
        self._parser = httptools.HttpResponseParser(self)
        self._status: int | None = None
        self._until_close = True
        self._body: list[bytes] = []
        self._partial = b""
        self._on_line = on_line
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(head + payload)  # one write: the request is small
        return await self._done


class EventStreamClient:
    """POSTs of JSON to one server, each answer read line by line as it arrives."""

    def __init__(self, url: str, headers: dict[str, str] | None = None,
                 connect_timeout_s: float = 10.0, timeout_s: float = 600.0):
        """`headers`: sent with every request (an `Authorization`, say)."""
        parts = urlsplit(url)
        self.extra_headers = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.host, self.port = parts.hostname, parts.port or 80
        self.base_path = parts.path.rstrip("/")
        self.connect_timeout_s, self.timeout_s = connect_timeout_s, timeout_s
        self._idle: list[_Connection] = []

    async def post_lines(self, path: str, body: dict, on_line: Callable[[bytes], None]
                         ) -> tuple[int, bytes]:
        """Send `body` to `path`; `on_line(line)` for each line of a 200's body as it is
        read. Returns the status, and the body when the status is not 200."""
        payload = json.dumps(body).encode()
        head = (f"POST {self.base_path}{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nAccept: */*\r\n{self.extra_headers}"
                f"Content-Length: {len(payload)}\r\n\r\n").encode()
        connection = await self._connection()
        try:
            answer = await asyncio.wait_for(connection.request(head, payload, on_line), self.timeout_s)
        except BaseException:
            connection.transport.close()  # a half-read answer cannot be reused
            raise
        if not connection.closed:
            self._idle.append(connection)
        return answer

    async def _connection(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
        loop = asyncio.get_running_loop()
        _, connection = await asyncio.wait_for(
            loop.create_connection(_Connection, self.host, self.port), self.connect_timeout_s)
        return connection

    def close(self) -> None:
        for connection in self._idle:
            connection.transport.close()
        self._idle.clear()
