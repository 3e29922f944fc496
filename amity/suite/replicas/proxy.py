"""Forwarding one request to a replica and its answer back, streamed both ways.

The answer's bytes go out as they arrive (the body's pieces as the relay's client,
amity/http_client.py, parses them: no decoding, no buffering), with the replica's status and
headers. While it streams, a disconnect of the client is watched for; it closes the
connection to the replica, which aborts the request there. A replica that dies
mid-answer ends a stream with an `error` event (the container's own shape) and any
other body where it broke: never a hang. An answer that the Suite reshapes (`rewrite`:
the dedicated image operations) is read whole when it is a 200, rewritten, and sent
with its new length.
"""

import json
import logging
import urllib.parse
from collections.abc import AsyncIterable, AsyncIterator, Callable

import anyio
import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from amity.http_client import Answer, HttpClient, HttpClientError

log = logging.getLogger("amity.suite.replicas")
# httpx logs every request at INFO: the health probes alone would flood the Suite's log.
logging.getLogger("httpx").setLevel(logging.WARNING)

# Hop-by-hop headers (RFC 9110 7.6.1), the ones the relay sets itself, and `expect`
# (the Suite's server answered the client's 100-continue; the relay sends the body
# whole or streams it without waiting for one).
_HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
        b"trailer", b"transfer-encoding", b"upgrade", b"host", b"content-length", b"expect"}


def request_headers(request: Request, drop: tuple[str, ...] = ()) -> list[tuple[bytes, bytes]]:
    """The client's headers to pass on, as it sent them (the server gives their names
    lower-cased), but the hop-by-hop ones and `drop`."""
    dropped = _HOP.union(name.encode("latin-1") for name in drop)
    return [(k, v) for k, v in request.scope["headers"] if k not in dropped]


def replica_unreachable(error: Exception) -> JSONResponse:
    # 502: the replica failed this request; the controller replaces a dead one.
    return JSONResponse({"detail": [{"loc": [], "msg": f"the replica failed: {error!r}",
                                     "type": "replica_error"}]}, status_code=502)


class Upstream(Response):
    """The replica's answer, relayed."""

    def __init__(self, answer: Answer, on_close: Callable[[], None],
                 rewrite: Callable[[bytes], bytes] | None = None):
        self.answer, self.on_close = answer, on_close
        self.status_code = answer.status
        self.rewrite = rewrite if answer.status == 200 else None
        self.background = None
        dropped = _HOP if self.rewrite else _HOP - {b"content-length"}
        self.raw_headers = [(k, v) for k, v in answer.headers if k not in dropped]
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
            async for chunk in self.answer:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except HttpClientError as error:
            log.warning("a replica's answer broke off: %r", error)
            if self.is_event_stream:
                event = {"error": {"message": f"the replica failed: {error!r}",
                                   "type": "replica_error"}}
                await send({"type": "http.response.body", "more_body": True,
                            "body": f"event: error\ndata: {json.dumps(event)}\n\n".encode()})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _relay_rewritten(self, send: Send) -> None:
        try:
            status, body = self.status_code, self.rewrite(await self.answer.read())
            headers = self.raw_headers + [(b"content-length", str(len(body)).encode())]
        except HttpClientError as error:
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


def _replica_url(url: str, request: Request) -> str:
    """`url` with its path percent-encoded again (it comes decoded: a path parameter)
    and the client's query as it came."""
    scheme, _, rest = url.partition("://")
    netloc, _, path = rest.partition("/")  # not urlsplit: a decoded path may hold a "?"
    target = urllib.parse.quote("/" + path, safe="/:@!$&'()*+,;=")
    if query := request.scope["query_string"]:
        target += "?" + query.decode("latin-1")
    return f"{scheme}://{netloc}{target}"


async def forward(client: "ReplicaClient", url: str, request: Request,
                  body: bytes | AsyncIterable[bytes], on_close: Callable[[], None],
                  headers: list[tuple[bytes, bytes]] | None = None,
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
    target = _replica_url(url, request)
    headers = headers if headers is not None else request_headers(request)
    answer: Answer | Response | None = None
    failure: Exception | None = None  # raised out here: a task group would wrap it
    try:
        async with anyio.create_task_group() as group:
            async def send() -> None:
                nonlocal answer, failure
                try:
                    answer = await client.relay.request(request.method, target, headers, body)
                except HttpClientError as error:
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
        if isinstance(answer, Answer):
            with anyio.CancelScope(shield=True):
                await answer.aclose()
        on_close()
        raise
    if isinstance(answer, Answer):
        return Upstream(answer, on_close, rewrite)
    on_close()
    if failure is not None:
        raise failure
    # None: the client hung up; nobody reads this answer (499, as nginx logs it).
    return answer or Response(status_code=499)


class ReplicaClient(httpx.AsyncClient):
    """httpx for the health probes and one-off calls, and `relay`, the relay's own
    connections (amity/http_client.py)."""

    def __init__(self, uds: str | None = None):
        self.relay = HttpClient(uds)
        # verify=False: replicas speak plain HTTP, and loading the CA bundle for
        # nothing costs a tenth of a second of CPU per replica started. No proxies
        # from the environment: replicas are on loopback. No read timeout: a long
        # generation is not an error; a dead replica breaks the connection.
        super().__init__(transport=httpx.AsyncHTTPTransport(uds=uds, verify=False), trust_env=False,
                         timeout=httpx.Timeout(None, connect=10.0))

    async def aclose(self) -> None:
        await self.relay.aclose()
        await super().aclose()


def new_client(uds: str | None = None) -> ReplicaClient:
    """A client for replicas, which connects to the Unix socket `uds` when given (the
    URL then only names the replica): on one machine, a Unix socket spares both sides
    the kernel's TCP work for every chunk."""
    return ReplicaClient(uds)
