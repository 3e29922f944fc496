"""A real server for the tests: uvicorn on 127.0.0.1 on a free port, in a thread,
serving the real default model (SmolLM2-135M GGUF) through the real engine."""

import socket
import threading
import time

import anthropic
import httpx
import openai
import pytest

from amity.config import EngineConfig, ServerConfig
from amity.engine.async_engine import AsyncEngine
from amity.server.app import build_app
from amity.server.main import ApiServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningServer:
    """`amity serve`'s server (ApiServer: its drain and shutdown timeout) in a thread."""

    def __init__(self, engine, port: int, max_queue_len: int = 256, owns_engine=True,
                 shutdown_timeout: float = 30.0):
        self.engine = engine
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        config = ServerConfig(port=port, max_queue_len=max_queue_len,
                              shutdown_timeout=shutdown_timeout)
        self.app = build_app(engine, config, owns_engine=owns_engine)
        self.state = self.app.state.amity
        self.server = ApiServer(self.app, self.state, "127.0.0.1", port, shutdown_timeout,
                                log_level="warning")
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=60)


@pytest.fixture(scope="session")
def engine():
    return AsyncEngine.from_config(EngineConfig(max_model_len=2048, compile="false"))


@pytest.fixture(scope="session")
def server(engine):
    with RunningServer(engine, free_port(), max_queue_len=256) as running:
        yield running


@pytest.fixture(scope="session")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def oai(server):
    """The `openai` SDK, unchanged, with retries off so a server bug fails fast."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key="ignored", max_retries=0)


@pytest.fixture(scope="session")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="ignored", max_retries=0)


@pytest.fixture(scope="session")
def model_name(http):
    return http.get("/v1/models").json()["data"][0]["id"]


def sse_data(text: str) -> list[str]:
    """The `data:` payloads of an SSE body, in order."""
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
