"""A real-socket server that streams the completions SSE format at a pace we set.

It streams exactly as amity does (token chunks, a finish_reason chunk, a usage chunk,
[DONE]) with the first token `TTFT` after the request and one every `ITL` after that, on
an absolute schedule so jitter does not add up. Like a real model it stops early (at
`EARLY_EOS` tokens) unless told `min_tokens`, so a generator that does not pin the
output length fails the count checks.
"""

import asyncio
import json
import socket
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

TTFT, ITL, M, L = 0.050, 0.020, 16, 12
EARLY_EOS = 5


class PacedServer:
    """`amity_like`: /v1/tokenize + `tokens` prompts; otherwise a peer: vLLM's /tokenize
    and text prompts only. One token per whitespace-separated word."""

    def __init__(self, usage_delta: int = 0, amity_like: bool = True):
        self.usage_delta, self.amity_like = usage_delta, amity_like
        self.bodies: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        routes = [Route("/v1/models", self.models), Route("/v1/completions", self.completions,
                                                           methods=["POST"]),
                  Route("/v1/tokenize" if amity_like else "/tokenize", self.tokenize,
                        methods=["POST"])]
        self.app = Starlette(routes=routes)

    @staticmethod
    def ids(text: str) -> list[int]:
        return [hash(w) % 1000 for w in text.split()]

    async def models(self, request):
        return JSONResponse({"object": "list", "data": [{"id": "paced", "object": "model"}]})

    async def tokenize(self, request):
        return JSONResponse({"tokens": self.ids((await request.json())["prompt"])})

    async def completions(self, request):
        body = await request.json()
        if "tokens" in body and not self.amity_like:
            return JSONResponse({"error": "prompt is required"}, status_code=400)
        prompt = body["tokens"] if "tokens" in body else self.ids(body["prompt"])
        n = body.get("max_tokens") or 16
        if (body.get("min_tokens") or 0) < n:
            n = min(n, EARLY_EOS)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": n + self.usage_delta,
                 "total_tokens": len(prompt) + n + self.usage_delta}
        if not body.get("stream"):
            return JSONResponse({"choices": [{"text": " w" * n, "finish_reason": "length"}],
                                 "usage": usage})
        self.bodies.append(body)
        return StreamingResponse(self.stream(n, usage), media_type="text/event-stream")

    async def stream(self, n: int, usage: dict):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            t0 = time.perf_counter()
            for k in range(n):
                # Until the schedule is reached: uvloop's timers count whole milliseconds
                # and may wake a fraction of one early.
                while (wait_s := t0 + TTFT + k * ITL - time.perf_counter()) > 0:
                    await asyncio.sleep(wait_s)
                yield self.frame([{"index": 0, "text": f" w{k}", "token": k}])
            yield self.frame([{"index": 0, "text": "", "finish_reason": "length"}])
            yield self.frame([], usage)
            yield b"data: [DONE]\n\n"
        finally:
            self.in_flight -= 1

    @staticmethod
    def frame(choices, usage=None) -> bytes:
        chunk = {"id": "cmpl-1", "object": "text_completion", "model": "paced", "choices": choices}
        if usage:
            chunk["usage"] = usage
        return f"data: {json.dumps(chunk)}\n\n".encode()


@pytest.fixture
def start_server():
    started = []

    def start(**kwargs) -> tuple[PacedServer, str]:
        paced = PacedServer(**kwargs)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(paced.app, log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "paced server did not start"
            time.sleep(0.01)
        started.append((server, thread))
        return paced, f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield start
    for server, thread in started:
        server.should_exit = True
        thread.join(timeout=5)
