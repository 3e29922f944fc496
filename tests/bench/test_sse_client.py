"""The load generator's lean HTTP/1.1 client against a raw socket server that writes
exactly the bytes each test gives it, split where the test says."""

import asyncio
import json

import pytest

from amity.bench.sse_client import EventStreamClient


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def serve(answers: list[list[bytes]], close_after: bool = False):
    """A server that answers its k-th request (on any connection) with answers[k], each
    piece written and flushed on its own; returns (url, requests seen, connections)."""
    seen, connections = [], []

    async def handle(reader, writer):
        connections.append(writer)
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            seen.append((head, json.loads(await reader.readexactly(length))))
            for piece in answers[len(seen) - 1]:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.01)  # each piece its own read on the other side
            if close_after:
                writer.close()
                return

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/base", seen, connections


def run(coro):
    return asyncio.run(coro)


def test_lines_split_anywhere_arrive_whole_and_the_connection_is_reused():
    body = b'data: {"a": 1}\n\ndata: {"b": 2}\r\n\r\ndata: [DONE]\n\n'
    # The chunked body cut into 3-byte writes: lines and chunk headers split mid-way.
    raw = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
           + chunked(body[:7], body[7:30], body[30:]))
    pieces = [raw[i:i + 3] for i in range(0, len(raw), 3)]

    async def go():
        server, url, seen, connections = await serve([pieces, pieces])
        client = EventStreamClient(url, headers={"Authorization": "Bearer k"})
        for _ in range(2):
            lines = []
            status, text = await client.post_lines("/v1/completions", {"x": 1}, lines.append)
            assert (status, text) == (200, b"")
            assert lines == [b'data: {"a": 1}', b"", b'data: {"b": 2}', b"", b"data: [DONE]", b""]
        client.close()
        server.close()
        return seen, connections

    seen, connections = run(go())
    assert len(seen) == 2 and len(connections) == 1  # kept alive, reused
    head, body_sent = seen[0]
    assert head.startswith(b"POST /base/v1/completions HTTP/1.1\r\n") and body_sent == {"x": 1}
    assert b"\r\nAuthorization: Bearer k\r\n" in head


def test_an_error_status_returns_its_body_and_no_lines():
    payload = b'{"detail": "bad"}'
    raw = b"HTTP/1.1 422 Unprocessable\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)

    async def go():
        server, url, _, _ = await serve([[raw]])
        lines = []
        answer = await EventStreamClient(url).post_lines("/v1/completions", {}, lines.append)
        server.close()
        return answer, lines

    assert run(go()) == ((422, payload), [])


def test_a_body_read_until_the_server_closes_ends_there():
    raw = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\ndata: 1\n\ndata: 2"

    async def go():
        server, url, _, _ = await serve([[raw]], close_after=True)
        client = EventStreamClient(url)
        lines = []
        answer = await client.post_lines("/x", {}, lines.append)
        server.close()
        return answer, lines, client._idle

    answer, lines, idle = run(go())
    assert answer == (200, b"") and lines == [b"data: 1", b"", b"data: 2"]
    assert idle == []  # a closed connection is not kept


def test_a_server_that_dies_mid_answer_is_an_error_not_a_hang():
    raw = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           + b"%x\r\n%s\r\n" % (len(b"data: 1\n\n"), b"data: 1\n\n"))  # no last chunk

    async def go():
        server, url, _, _ = await serve([[raw]], close_after=True)
        lines = []
        try:
            with pytest.raises(ConnectionError):
                await EventStreamClient(url, timeout_s=10).post_lines("/x", {}, lines.append)
        finally:
            server.close()
        return lines

    assert run(go()) == [b"data: 1", b""]


def test_a_failing_line_handler_fails_the_request():
    raw = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(b"data: {oops\n\n"))

    async def go():
        server, url, _, _ = await serve([[raw]])
        try:
            with pytest.raises(json.JSONDecodeError):
                await EventStreamClient(url).post_lines(
                    "/x", {}, lambda line: json.loads(line[5:]) if line else None)
        finally:
            server.close()

    run(go())
