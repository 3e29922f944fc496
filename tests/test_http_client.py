"""amity/http_client.py (the relay's and the load generator's HTTP/1.1 client) against scripted servers on a
real Unix socket (and TCP, the Ray backend's way): what the server writes, and where
it pauses or breaks, is exact. On asyncio's loop and on uvloop (the Suite's)."""

import asyncio

import pytest
import uvloop

from amity.http_client import HttpClient, HttpClientError

URL = "http://replica/v1/completions"
HEADERS = [(b"content-type", b"application/json")]


class Scripted:
    """A server whose every connection runs `script(reader, writer)`; it counts
    connections and keeps what each request's head and body were."""

    def __init__(self, script):
        self.script, self.connections, self.requests = script, 0, []

    async def handle(self, reader, writer):
        self.connections += 1
        try:
            await self.script(self, reader, writer)
        finally:
            writer.close()

    async def read_request(self, reader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").lower().split("\r\n")
        length = next((int(line.split(":")[1]) for line in lines if line.startswith("content-length:")), None)
        if length is not None:
            body = await reader.readexactly(length)
        elif "transfer-encoding: chunked" in lines:
            body = await reader.readuntil(b"0\r\n\r\n")
        else:
            body = b""
        self.requests.append((head, body))
        return head

    async def each_request(self, reader):
        """The connection's requests, read one by one until the client closes it."""
        while True:
            try:
                yield await self.read_request(reader)
            except asyncio.IncompleteReadError:
                return


async def on_unix(tmp_path, script):
    server = Scripted(script)
    path = str(tmp_path / "replica.sock")
    return server, await asyncio.start_unix_server(server.handle, path), HttpClient(path)


def run(new_loop, scenario):
    loop = new_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(scenario(), 30))
    finally:
        loop.close()


LOOPS = pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop],
                                ids=["asyncio", "uvloop"])


@LOOPS
def test_a_chunked_body_split_across_reads_comes_out_as_it_arrives(tmp_path, new_loop):
    go_on = None

    async def script(server, reader, writer):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n5\r\nhel")
        await go_on.wait()  # the client must have the first piece before the rest exists
        writer.write(b"lo\r\n3")
        await asyncio.sleep(0.05)
        writer.write(b"\r\nabc\r\n0\r\n")
        await asyncio.sleep(0.05)
        writer.write(b"\r\n")
        await reader.read()  # until the client closes

    async def scenario():
        nonlocal go_on
        go_on = asyncio.Event()
        server, listening, client = await on_unix(tmp_path, script)
        async with listening:
            answer = await client.request("POST", URL, HEADERS, b'{"x": 1}')
            assert answer.status == 200
            assert (b"content-type", b"text/event-stream") in answer.headers
            pieces = aiter(answer)
            assert await anext(pieces) == b"hel"
            go_on.set()
            assert b"".join([piece async for piece in pieces]) == b"loabc"
            await answer.aclose()
            await client.aclose()
        head, body = server.requests[0]
        assert head.startswith(b"POST /v1/completions HTTP/1.1\r\nhost: replica\r\n")
        assert b"content-length: 8\r\n" in head and body == b'{"x": 1}'

    run(new_loop, scenario)


@LOOPS
def test_keep_alive_reuses_a_connection_and_a_content_length_body_is_read_whole(tmp_path, new_loop):
    async def script(server, reader, writer):
        async for _ in server.each_request(reader):
            writer.write(b"HTTP/1.1 201 Created\r\ncontent-length: 11\r\n\r\nhello")
            await asyncio.sleep(0.02)
            writer.write(b" world")

    async def scenario():
        server, listening, client = await on_unix(tmp_path, script)
        async with listening:
            for i in range(3):
                answer = await client.request("POST", URL + f"?n={i}", HEADERS, b"{}")
                assert (answer.status, await answer.read()) == (201, b"hello world")
                await answer.aclose()
            assert server.connections == 1
            assert [head.split(b"\r\n")[0] for head, _ in server.requests] == [
                f"POST /v1/completions?n={i} HTTP/1.1".encode() for i in range(3)]
            await client.aclose()

    run(new_loop, scenario)


@LOOPS
def test_a_replica_closing_mid_body_is_an_error_and_the_next_request_gets_a_new_connection(tmp_path, new_loop):
    async def script(server, reader, writer):
        await server.read_request(reader)
        if server.connections == 1:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            await writer.drain()
            return  # the connection closes mid-body
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await reader.read()

    async def scenario():
        server, listening, client = await on_unix(tmp_path, script)
        async with listening:
            answer = await client.request("GET", URL, [], b"")
            pieces = []
            with pytest.raises(HttpClientError, match="mid-answer"):
                async for piece in answer:
                    pieces.append(piece)
            assert pieces == [b"first"]
            await answer.aclose()
            answer = await client.request("GET", URL, [], b"")
            assert await answer.read() == b"ok"
            await answer.aclose()
            assert server.connections == 2
            await client.aclose()

    run(new_loop, scenario)


@LOOPS
def test_closing_an_answer_early_closes_its_connection(tmp_path, new_loop):
    saw_end = None

    async def script(server, reader, writer):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
        assert await reader.read() == b""  # the client hung up: the replica would abort
        saw_end.set()

    async def scenario():
        nonlocal saw_end
        saw_end = asyncio.Event()
        _server, listening, client = await on_unix(tmp_path, script)
        async with listening:
            answer = await client.request("POST", URL, HEADERS, b"{}")
            assert await anext(aiter(answer)) == b"a"
            await answer.aclose()
            await saw_end.wait()
            await client.aclose()

    run(new_loop, scenario)


@LOOPS
def test_a_streamed_request_body_goes_chunked_or_with_its_length(tmp_path, new_loop):
    async def script(server, reader, writer):
        async for _ in server.each_request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")

    async def parts():
        for part in (b"abc", b"", b"defgh"):
            yield part

    async def scenario():
        server, listening, client = await on_unix(tmp_path, script)
        async with listening:
            for headers in ([], [(b"content-length", b"8")]):
                answer = await client.request("POST", URL, headers, parts())
                assert await answer.read() == b""
                await answer.aclose()
            await client.aclose()
        (chunked_head, chunked), (sized_head, sized) = server.requests
        assert b"transfer-encoding: chunked\r\n" in chunked_head
        assert chunked == b"3\r\nabc\r\n5\r\ndefgh\r\n0\r\n\r\n"
        assert b"content-length: 8\r\n" in sized_head and sized == b"abcdefgh"

    run(new_loop, scenario)


@LOOPS
def test_an_idle_connection_the_replica_closed_is_not_reused(tmp_path, new_loop):
    async def script(server, reader, writer):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()  # then close: the replica's keep-alive timeout

    async def scenario():
        server, listening, client = await on_unix(tmp_path, script)
        async with listening:
            for _ in range(2):
                answer = await client.request("GET", URL, [], b"")
                assert await answer.read() == b"ok"
                await answer.aclose()
                await asyncio.sleep(0.1)  # the close arrives
            assert server.connections == 2
            await client.aclose()

    run(new_loop, scenario)


@LOOPS
def test_a_request_on_a_kept_connection_the_server_closed_meanwhile_is_sent_again(tmp_path, new_loop):
    async def script(server, reader, writer):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.05)  # then closes, unannounced, reading nothing more

    async def scenario():
        server, listening, client = await on_unix(tmp_path, script)
        async with listening:
            for _ in range(3):  # each next request goes out on the kept connection at once
                answer = await client.request("POST", URL, HEADERS, b"{}")
                assert await answer.read() == b"ok"
                await answer.aclose()
            # Each request after the first went out twice: on the kept connection, which
            # the server read nothing of, then on a new one; each was read once.
            assert server.connections == 3 and len(server.requests) == 3
            await client.aclose()

    run(new_loop, scenario)


@LOOPS
def test_tcp_and_a_missing_replica(tmp_path, new_loop):
    async def script(server, reader, writer):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 4\r\n\r\nnope")
        await reader.read()

    async def scenario():
        server = Scripted(script)
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = listening.sockets[0].getsockname()[1]
        client = HttpClient()
        async with listening:
            answer = await client.request("GET", f"http://127.0.0.1:{port}/health", [], b"")
            assert (answer.status, await answer.read()) == (404, b"nope")
            await answer.aclose()
            assert server.requests[0][0].startswith(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1:")
        await client.aclose()
        with pytest.raises(HttpClientError, match="cannot connect"):
            await client.request("GET", f"http://127.0.0.1:{port}/health", [], b"")
        with pytest.raises(HttpClientError, match="cannot connect"):
            await HttpClient(str(tmp_path / "no.sock")).request("GET", URL, [], b"")

    run(new_loop, scenario)


@LOOPS
def test_a_malformed_answer_is_an_error(tmp_path, new_loop):
    async def script(server, reader, writer):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n")
        await reader.read()

    async def scenario():
        _server, listening, client = await on_unix(tmp_path, script)
        async with listening:
            answer = await client.request("GET", URL, [], b"")
            with pytest.raises(HttpClientError, match="malformed"):
                await answer.read()
            await answer.aclose()
            await client.aclose()

    run(new_loop, scenario)


@LOOPS
def test_a_slow_reader_pauses_the_socket_and_gets_the_whole_body(tmp_path, new_loop):
    piece = bytes(range(256)) * 256  # 64 KiB

    async def script(server, reader, writer):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(32):  # 2 MiB
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await reader.read()

    async def scenario():
        _server, listening, client = await on_unix(tmp_path, script)
        async with listening:
            answer = await client.request("GET", URL, [], b"")
            await asyncio.sleep(0.3)  # the replica writes on; the client reads nothing
            assert not answer._connection.transport.is_reading()  # past 256 KiB held
            assert await answer.read() == piece * 32
            await answer.aclose()
            await client.aclose()

    run(new_loop, scenario)
