"""The router's client for a local replica (replicas/proxy.new_client with a Unix
socket, on replicas/unix_streams.py) against a real uvicorn server on a real socket:
chunks arrive as they were sent, a kept-alive connection the server closed is not
reused, and a broken answer or a missing server is an httpx error; on asyncio's loop
and on uvloop (the Suite's)."""

import asyncio

import httpx
import pytest
import uvicorn
import uvloop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from amity.suite.replicas.proxy import new_client

CHUNKS = [f"data: {i}\n\n".encode() for i in range(5)]


async def stream(_request: Request) -> Response:
    async def chunks():
        for chunk in CHUNKS:
            yield chunk
            await asyncio.sleep(0.02)  # each its own write
    return StreamingResponse(chunks(), media_type="text/event-stream")


async def echo_length(request: Request) -> Response:
    return PlainTextResponse(str(len(await request.body())))


async def broken(_request: Request) -> Response:
    async def chunks():
        yield b"first"
        raise RuntimeError("the replica died mid-answer")
    return StreamingResponse(chunks())


APP = Starlette(routes=[Route("/stream", stream), Route("/echo", echo_length, methods=["POST"]),
                        Route("/broken", broken)])
URL = "http://127.0.0.1:9"  # names the replica; the socket is where the client connects


async def serve(path: str) -> tuple[uvicorn.Server, asyncio.Task]:
    server = uvicorn.Server(uvicorn.Config(APP, uds=path, log_level="warning",
                                           timeout_keep_alive=1))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task


@pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop],
                         ids=["asyncio", "uvloop"])
def test_streams_keep_alive_and_errors_over_a_unix_socket(tmp_path, new_loop):
    path = str(tmp_path / "replica.sock")

    async def scenario() -> None:
        server, task = await serve(path)
        client = new_client(path)
        try:
            async with client.stream("GET", URL + "/stream") as answer:
                assert [chunk async for chunk in answer.aiter_raw()] == CHUNKS
            body = b"x" * 3_000_000  # past the socket's buffers: the writer waits for drain
            assert (await client.post(URL + "/echo", content=body)).text == str(len(body))
            await asyncio.sleep(1.5)  # the server closes the idle kept-alive connection
            assert (await client.post(URL + "/echo", content=b"abc")).text == "3"
            with pytest.raises(httpx.RemoteProtocolError):
                async with client.stream("GET", URL + "/broken") as answer:
                    async for _ in answer.aiter_raw():
                        pass
        finally:
            server.should_exit = True
            await task
        with pytest.raises(httpx.ConnectError):
            await client.get(URL + "/stream")
        await client.aclose()

    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(scenario())
