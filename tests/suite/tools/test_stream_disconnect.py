"""A client that leaves a tool-assisted stream before its first byte gives its replica
slot back: the Suite (served by uvicorn on a real socket, in a thread, so that the
disconnect is a real one) runs the loop on a shared replica it started itself, and
the replica set's outstanding count returns to 0."""

import json
import socket
import threading
import time

import pytest
import uvicorn

from amity.config import StoreConfig, SuiteConfig
from amity.suite.app import open_suite
from tests.suite.conftest import ADMIN_TOKEN, free_port
from tests.suite.tools.conftest import DEFAULT_MODEL_ENTRY

pytestmark = pytest.mark.slow  # a replica of the default model starts

MODEL = "acme/tools"
CATALOG = DEFAULT_MODEL_ENTRY.format(id=MODEL, replicas="always-on")
WAIT_S = 600  # a generous bound on a loaded machine; the leak never ends by itself


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.fixture
def served_suite(tmp_path, monkeypatch):
    monkeypatch.setenv("AMITY_ADMIN_TOKEN", ADMIN_TOKEN)
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(CATALOG)
    suite = open_suite(SuiteConfig(container_model="none", catalog=str(catalog),
                                   wake_timeout_s=WAIT_S, replica_args="--kv-cache-memory 64MiB"),
                       StoreConfig(str(tmp_path / "data")), announce=lambda _line: None)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(suite.app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), "the Suite never started")
    assert thread.is_alive()
    yield suite.app, port
    server.should_exit = True  # the lifespan's end stops the replicas
    thread.join(timeout=120)


def post(port: int, body: dict) -> socket.socket:
    """The request sent on a raw socket, nothing read."""
    data = json.dumps(body).encode()
    head = (f"POST /serverless/tools/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {ADMIN_TOKEN}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(head + data)
    return sock


def test_leaving_before_the_first_chunk_gives_the_replica_slot_back(served_suite):
    app, port = served_suite
    body = {"model": MODEL, "stream": True, "temperature": 0, "max_tokens": 40,
            "messages": [{"role": "user", "content": "What is 150 * 1.60934?"}],
            "tools": [{"type": "math:calculator"}], "tool_choice": "required"}

    def replica_set():
        named = app.state.replicas.named.get("serverless:" + MODEL)
        return named[0] if named else None

    # A whole stream first: the replica is up, and a finished stream releases its slot.
    with post(port, body) as sock:
        received = b""
        while not received.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's last chunk
            chunk = sock.recv(65536)
            assert chunk, received.decode(errors="replace")
            received += chunk
    assert b"event: tool_status" in received and b"data: [DONE]" in received
    wait_until(lambda: replica_set().outstanding == 0, "a finished stream kept its slot")

    # Leave at once: the loop's first turn (the forced call) is still being generated,
    # so the client is gone before the stream's first byte.
    before = replica_set().last_request_s  # moves when a slot is taken and given back
    post(port, body).close()
    wait_until(lambda: replica_set().last_request_s > before and replica_set().outstanding == 0,
               "the slot of a client that left before the first chunk was never given back")
