"""amity's HTTP/1.1 client for streamed answers: the Suite's relay to its replicas, and
the load generator of `amity bench` (amity/bench/serve.py). One request at a time per
connection, the answer's body handed on as it arrives.

Both run where CPU per streamed chunk counts: the relay shares the machine with its
replicas, the load generator with the server it measures. httpx/httpcore cost more per
chunk and per request (benchmarks/README.md, "Router", Session 12; "Served against
offline", Session 12): h11's parser, a write and a drain for each of the head, the body
and the end of the request, the connection pool's bookkeeping, half a dozen
async-generator layers per chunk. Here a connection is an asyncio protocol: what the
socket delivers goes straight to httptools' response parser, whose callbacks queue the
body's pieces; the request goes out in one write when its body is known. Bodies come
out as they arrived (a chunk of a chunked body, or the part of it one read delivered):
never re-chunked or joined.

Connections are kept alive per origin (a Unix socket, or host and port) for
`keepalive_s`, below the 5 s after which `amity serve` (uvicorn) closes an idle one. A
connection closed during an exchange raises HttpClientError; so does a malformed answer.
Closing an answer before its end closes its connection: that is how a server (a
replica) learns that the client left.
"""

import asyncio
import time
import urllib.parse
from collections.abc import AsyncIterable, AsyncIterator

import httptools

# Body pieces buffered before the socket stops being read (the client reads slower
# than the server writes): the server then waits on its own socket's buffers.
_PAUSE_READING_BYTES = 256 * 1024


class HttpClientError(Exception):
    """The server could not be reached, broke the connection, or answered malformed."""


class Answer:
    """A server's answer: `status`, `headers` (lower-cased names, bytes), and the body,
    by `async for` or `read()`. `aclose()` when done, read to the end or not."""

    def __init__(self, connection: "_Connection", pool: "HttpClient", key: object):
        self._connection, self._pool, self._key = connection, pool, key
        self.status = connection.status
        self.headers = connection.headers

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._connection.body()

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self])

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if connection.reusable():
            self._pool._keep(self._key, connection)
        else:
            connection.close()


class _Connection(asyncio.Protocol):
    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since_s = 0.0
        self._writable: asyncio.Future | None = None  # set while the transport pauses writing
        self._start_exchange()

    def _start_exchange(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.headers = 0, []
        self.received = False  # any byte of this exchange's answer
        self._head: asyncio.Future | None = None
        self._pieces: list[bytes] = []
        self._buffered, self._reading_paused = 0, False
        self._complete = self._keep_alive = False
        self._error: HttpClientError | None = None
        self._wakeup: asyncio.Future | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received = True
        if self._head is None or self._complete:  # an idle connection has nothing to say
            self._fail(HttpClientError(f"the server sent {data[:80]!r} unasked"))
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(HttpClientError(f"the answer is malformed: {error}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self._complete:
            self._fail(HttpClientError(f"the server closed the connection mid-answer ({exc})"
                                        if self._head is not None else "the server closed the connection"))
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if not self._head.done():
            self._head.set_result(None)

    def on_body(self, piece: bytes) -> None:
        self._pieces.append(piece)
        self._buffered += len(piece)
        if self._buffered > _PAUSE_READING_BYTES and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        # Asked now: once the message is over, the parser has forgotten its headers.
        self._keep_alive = self.parser.should_keep_alive()
        self._complete = True
        self._wake()

    # the exchange
    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def _fail(self, error: HttpClientError) -> None:
        if self._error is None and not self._complete:
            self._error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        self._wake()
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def reusable(self) -> bool:
        return self._complete and self._keep_alive and not (self.closed or self.transport.is_closing())

    async def _write(self, data: bytes) -> None:
        if self.closed:
            raise self._error or HttpClientError("the server closed the connection")
        self.transport.write(data)
        if self._writable is not None:
            await self._writable

    async def exchange(self, head: bytes, body: bytes | AsyncIterable[bytes], chunked: bool) -> None:
        """Send the request; returns once the answer's head has arrived."""
        self._start_exchange()
        self._head = asyncio.get_running_loop().create_future()
        if isinstance(body, bytes):
            await self._write(head + body)  # one write: one syscall, one packet
        else:
            await self._write(head)
            async for piece in body:
                if piece:
                    await self._write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            if chunked:
                await self._write(b"0\r\n\r\n")
        await self._head

    async def body(self) -> AsyncIterator[bytes]:
        while True:
            if self._pieces:
                pieces, self._pieces, self._buffered = self._pieces, [], 0
                if self._reading_paused and not self.closed:
                    self._reading_paused = False
                    self.transport.resume_reading()
                for piece in pieces:
                    yield piece
            elif self._complete:
                return
            elif self._error is not None:
                raise self._error
            else:
                self._wakeup = asyncio.get_running_loop().create_future()
                await self._wakeup


class HttpClient:
    """Kept-alive connections: over the Unix socket `uds` when given (the URL then only
    names the server: a replica's socket), else over TCP to the URL's host and port."""

    def __init__(self, uds: str | None = None, keepalive_s: float = 4.0, max_idle: int = 64,
                 connect_timeout_s: float = 10.0):
        self.uds, self.keepalive_s, self.max_idle = uds, keepalive_s, max_idle
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[object, list[_Connection]] = {}

    async def request(self, method: str, url: str, headers: list[tuple[bytes, bytes]],
                      body: bytes | AsyncIterable[bytes]) -> Answer:
        """Send `method url` (`url`'s path and query already percent-encoded) with
        `headers` and `body` (bytes: sent with its length; a stream: chunked unless
        `headers` give a length); returns once the answer's head has arrived."""
        _, _, rest = url.partition("://")
        netloc, _, target = rest.partition("/")
        chunked = not isinstance(body, bytes) and not any(k == b"content-length" for k, _ in headers)
        framing = (b"content-length: %d\r\n" % len(body) if isinstance(body, bytes)
                   else b"transfer-encoding: chunked\r\n" if chunked else b"")
        head = b"".join([method.encode("ascii"), b" /", target.encode("latin-1"), b" HTTP/1.1\r\nhost: ",
                         netloc.encode("ascii"), b"\r\n",
                         *(b"%s: %s\r\n" % (k, v) for k, v in headers), framing, b"\r\n"])
        key = self.uds or netloc
        kept = self._kept(key)
        connection = kept or await self._connect(netloc)
        while True:
            try:
                await connection.exchange(head, body, chunked)
                return Answer(connection, self, key)
            except BaseException as error:
                connection.close()
                # A kept connection the server closed as we reused it (a keep-alive
                # limit: llama.cpp's server closes after each stream) answered nothing:
                # send the request again on a new one, as httpcore does, when it can be.
                if not (isinstance(error, HttpClientError) and connection is kept
                        and not connection.received and isinstance(body, bytes)):
                    raise
            connection = await self._connect(netloc)

    def _kept(self, key: object) -> _Connection | None:
        idle, now = self._idle.get(key, []), time.monotonic()
        while idle:
            connection = idle.pop()
            if (not connection.closed and not connection.transport.is_closing()
                    and now - connection.idle_since_s < self.keepalive_s):
                return connection
            connection.close()
        return None

    def _keep(self, key: object, connection: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) >= self.max_idle:
            connection.close()
            return
        connection.idle_since_s = time.monotonic()
        idle.append(connection)

    async def _connect(self, netloc: str) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                if self.uds is not None:
                    _, connection = await loop.create_unix_connection(_Connection, self.uds)
                else:
                    origin = urllib.parse.urlsplit("//" + netloc)
                    _, connection = await loop.create_connection(_Connection, origin.hostname,
                                                                 origin.port or 80)
        except (OSError, TimeoutError) as error:
            raise HttpClientError(f"cannot connect: {error!r}") from error
        return connection

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
