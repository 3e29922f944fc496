"""Forwarding one request to a replica and its answer back, streamed both ways.

The answer's bytes go out as they arrive (httpcore's body chunks: no decoding, no
buffering), with the replica's status and headers. The exchange speaks to the
client's httpcore connection pool directly: httpx's request building and its three
stream layers per relayed chunk were CPU the relay does not need (benchmarks/README.md,
"Router"). While it streams, a disconnect of the client
is watched for; it closes the connection to the replica, which aborts the request
there. A replica that dies mid-answer ends a stream with an `error` event (the
container's own shape) and any other body where it broke: never a hang. An answer
that the Suite reshapes (`rewrite`: the dedicated image operations) is read whole
when it is a 200, rewritten, and sent with its new length.
"""

import json
import logging
import urllib.parse
from collections.abc import AsyncIterable, AsyncIterator, Callable

import anyio
import httpcore
import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from amity.suite.replicas.unix_streams import UnixStreams

log = logging.getLogger("amity.suite.replicas")
# httpx logs every request at INFO: the health probes alone would flood the Suite's log.
logging.getLogger("httpx").setLevel(logging.WARNING)

# httpcore's errors for an exchange the replica failed (httpx maps the same ones).
REPLICA_ERRORS = (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError)
# The relay's timeouts: no read timeout (a long generation is not an error; a dead
# replica breaks the connection).
_TIMEOUTS = {"timeout": {"connect": 10.0, "read": None, "write": None, "pool": None}}

# Hop-by-hop headers (RFC 9110 7.6.1) and the ones the relay sets itself.
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
        "transfer-encoding", "upgrade", "host", "content-length"}


def request_headers(request: Request, drop: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    return [(k, v) for k, v in request.headers.items() if k not in _HOP and k not in drop]


def replica_unreachable(error: Exception) -> JSONResponse:
    # 502: the replica failed this request; the controller replaces a dead one.
    return JSONResponse({"detail": [{"loc": [], "msg": f"the replica failed: {error!r}",
                                     "type": "replica_error"}]}, status_code=502)


class Upstream(Response):
    """The replica's answer, relayed."""

    def __init__(self, answer: httpcore.Response, on_close: Callable[[], None],
                 rewrite: Callable[[bytes], bytes] | None = None):
        self.answer, self.on_close = answer, on_close
        self.status_code = answer.status
        self.rewrite = rewrite if answer.status == 200 else None
        self.background = None
        kept = _HOP if self.rewrite else _HOP - {"content-length"}
        self.raw_headers = [(k.lower(), v) for k, v in answer.headers
                            if k.decode("latin-1").lower() not in kept]
        self.is_event_stream = any(k == b"content-type" and v.startswith(b"text/event-stream")
                                   for k, v in self.raw_headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:
                async def relay() -> None:
                    await self._relay(send)
                    group.cancel_scope.cancel()

                async def watch_disconnect() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(relay)
                group.start_soon(watch_disconnect)
        finally:
            with anyio.CancelScope(shield=True):
                await self.answer.aclose()
                self.on_close()

    async def _relay(self, send: Send) -> None:
        if self.rewrite is not None:
            await self._relay_rewritten(send)
            return
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        try:
            async for chunk in self.answer.stream:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except REPLICA_ERRORS as error:
            log.warning("a replica's answer broke off: %r", error)
            if self.is_event_stream:
                event = {"error": {"message": f"the replica failed: {error!r}",
                                   "type": "replica_error"}}
                await send({"type": "http.response.body", "more_body": True,
                            "body": f"event: error\ndata: {json.dumps(event)}\n\n".encode()})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _relay_rewritten(self, send: Send) -> None:
        try:
            status, body = self.status_code, self.rewrite(await self.answer.aread())
            headers = self.raw_headers + [(b"content-length", str(len(body)).encode())]
        except REPLICA_ERRORS as error:
            log.warning("a replica's answer broke off: %r", error)
            failed = replica_unreachable(error)
            status, body, headers = failed.status_code, failed.body, failed.raw_headers
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


async def _sent_then_set(body: AsyncIterable[bytes], sent: anyio.Event) -> AsyncIterator[bytes]:
    async for chunk in body:
        yield chunk
    sent.set()


async def _disconnect(request: Request, body_sent: anyio.Event) -> None:
    """Returns when the client hangs up. It listens only once the body has been read
    (a receive before would take the body's chunks)."""
    await body_sent.wait()
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _outgoing(url: str, request: Request, headers: list[tuple[str, str]],
              body: bytes | AsyncIterable[bytes]) -> httpcore.Request:
    """The request to the replica, framed as httpx would: a Host, and a body of known
    length or a chunked one. `url`'s path comes decoded (a path parameter): it is
    percent-encoded again; the client's query goes on as it came."""
    scheme, _, rest = url.partition("://")
    netloc, _, path = rest.partition("/")  # not urlsplit: a decoded path may hold a "?"
    origin = urllib.parse.urlsplit(f"{scheme}://{netloc}")
    target = urllib.parse.quote("/" + path, safe="/:@!$&'()*+,;=").encode("ascii")
    if query := request.scope["query_string"]:
        target += b"?" + query
    framing = ([("content-length", str(len(body)))] if isinstance(body, bytes)
               else [] if any(k == "content-length" for k, _ in headers)
               else [("transfer-encoding", "chunked")])
    return httpcore.Request(
        request.method, httpcore.URL(scheme=scheme, host=origin.hostname, port=origin.port,
                                     target=target),
        # latin-1: the header bytes as the client sent them (starlette decoded them so).
        headers=[(k.encode("latin-1"), v.encode("latin-1"))
                 for k, v in [("host", netloc)] + headers + framing],
        content=body, extensions=_TIMEOUTS)


async def forward(client: "ReplicaClient", url: str, request: Request,
                  body: bytes | AsyncIterable[bytes], on_close: Callable[[], None],
                  headers: list[tuple[str, str]] | None = None,
                  rewrite: Callable[[bytes], bytes] | None = None) -> Response:
    """Send `request` (with `body`) to `url` and relay the answer (a 200 through
    `rewrite` when given). `on_close` runs once, whatever happens, when the exchange
    is over. A client that hangs up before the answer starts (a non-streamed one comes
    whole, when the replica is done) cancels the exchange: the connection to the
    replica closes, and the replica aborts the request."""
    body_sent = anyio.Event()
    if isinstance(body, bytes):
        body_sent.set()
    else:
        body = _sent_then_set(body, body_sent)
    outgoing = _outgoing(url, request, headers if headers is not None else request_headers(request),
                         body)
    answer: httpcore.Response | Response | None = None
    failure: Exception | None = None  # raised out here: a task group would wrap it
    try:
        async with anyio.create_task_group() as group:
            async def send() -> None:
                nonlocal answer, failure
                try:
                    answer = await client.pool.handle_async_request(outgoing)
                except REPLICA_ERRORS as error:
                    answer = replica_unreachable(error)
                except Exception as error:  # noqa: BLE001 - e.g. the client's body broke off
                    failure = error
                group.cancel_scope.cancel()

            async def watch_disconnect() -> None:
                await _disconnect(request, body_sent)
                group.cancel_scope.cancel()

            group.start_soon(send)
            group.start_soon(watch_disconnect)
    except BaseException:
        if isinstance(answer, httpcore.Response):
            with anyio.CancelScope(shield=True):
                await answer.aclose()
        on_close()
        raise
    if isinstance(answer, httpcore.Response):
        return Upstream(answer, on_close, rewrite)
    on_close()
    if failure is not None:
        raise failure
    # None: the client hung up; nobody reads this answer (499, as nginx logs it).
    return answer or Response(status_code=499)


class ReplicaClient(httpx.AsyncClient):
    """httpx for the health probes and one-off calls, and `pool`, the httpcore
    connection pool under it, for the relay."""

    def __init__(self, pool: httpcore.AsyncConnectionPool):
        # verify=False: replicas speak plain HTTP, and loading the CA bundle for
        # nothing costs a tenth of a second of CPU per replica started.
        transport = httpx.AsyncHTTPTransport(verify=False)
        # httpx takes no pool from its caller: this one replaces the transport's. Were
        # httpx to rename `_pool`, its calls would go over TCP to the URL; the relay's
        # would not notice.
        transport._pool = self.pool = pool
        # No proxies from the environment: replicas are on loopback. No read timeout:
        # a long generation is not an error; a dead replica breaks the connection.
        super().__init__(transport=transport, trust_env=False,
                         timeout=httpx.Timeout(None, connect=10.0))


def new_client(uds: str | None = None) -> ReplicaClient:
    """A client for replicas, which connects to the Unix socket `uds` when given (the
    URL then only names the replica): on one machine, a Unix socket spares both sides
    the kernel's TCP work for every chunk; it is read on asyncio's streams
    (unix_streams.py)."""
    unix = {"uds": uds, "network_backend": UnixStreams()} if uds is not None else {}
    return ReplicaClient(httpcore.AsyncConnectionPool(
        max_connections=None, max_keepalive_connections=64, keepalive_expiry=5.0, **unix))
