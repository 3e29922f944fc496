"""Unix-socket connections for httpcore (under httpx) on asyncio's own streams.

httpcore's default backend (anyio) reads a Unix socket as a raw socket: every read
registers the socket with the event loop, waits, receives and unregisters it (two
`epoll_ctl` calls and a cancel scope per streamed chunk). asyncio's streams keep the
socket registered and hand over what has arrived; on a streamed answer that is the
larger part of the router's cost per chunk after the writes themselves
(benchmarks/README.md, "Router").
"""

import asyncio
import contextlib
import typing

import httpcore

# httpcore's errors, which httpx maps to its own (the router catches httpx.HTTPError).
_READ_ERRORS = {TimeoutError: httpcore.ReadTimeout, OSError: httpcore.ReadError}
_WRITE_ERRORS = {TimeoutError: httpcore.WriteTimeout, OSError: httpcore.WriteError}
_CONNECT_ERRORS = {TimeoutError: httpcore.ConnectTimeout, OSError: httpcore.ConnectError}


@contextlib.contextmanager
def _mapped(errors: dict[type[Exception], type[Exception]]):
    try:
        yield
    except tuple(errors) as error:
        raise next(errors[kind] for kind in errors if isinstance(error, kind))(error) from error


async def _within(timeout_s: float | None, step: typing.Awaitable):
    if timeout_s is None:  # the common case: no timer to set up
        return await step
    async with asyncio.timeout(timeout_s):
        return await step


class UnixStream(httpcore.AsyncNetworkStream):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        with _mapped(_READ_ERRORS):
            return await _within(timeout, self.reader.read(max_bytes))

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        with _mapped(_WRITE_ERRORS):
            self.writer.write(buffer)
            await _within(timeout, self.writer.drain())

    async def aclose(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()

    def get_extra_info(self, info: str) -> typing.Any:
        # httpcore asks whether an idle kept-alive connection is readable: it is when
        # the replica closed it (the transport reads continuously, so an end of file
        # shows on the reader, not on the socket).
        if info == "is_readable":
            return self.reader.at_eof() or self.writer.transport.is_closing()
        return self.writer.get_extra_info(info)


class UnixStreams(httpcore.AsyncNetworkBackend):
    """Connections to Unix sockets only (the pool is given `uds=`)."""

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options=None) -> UnixStream:
        with _mapped(_CONNECT_ERRORS):
            return UnixStream(*await _within(timeout, asyncio.open_unix_connection(path)))

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
