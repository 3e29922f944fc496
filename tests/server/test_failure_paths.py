"""The server's failure paths, through real HTTP, with the real `AsyncEngine` driving a
fake core (tests/server/fake_engine.py): failures on demand, no model, seconds in all.
Every wait has a timeout: a path that hangs fails the test instead of stalling it."""

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest

from amity.engine.async_engine import AsyncEngine
from amity.engine.errors import RequestError
from amity.models.tokenizer import Tokenizer
from tests.server.conftest import RunningServer, free_port, sse_data
from tests.server.fake_engine import FakeCore, LoopKilled

TIMEOUT_S = 10


@pytest.fixture
def core(tiny_tokenizer_dir):
    return FakeCore(Tokenizer.from_path(tiny_tokenizer_dir))


@contextmanager
def serving(core: FakeCore):
    with RunningServer(AsyncEngine(core), free_port(), shutdown_timeout=0.5) as running:
        # A connection per request: after a 500, Starlette re-raises the error to uvicorn,
        # which then closes the connection, so a kept-alive one would be reset.
        with httpx.Client(base_url=running.url, timeout=TIMEOUT_S,
                          limits=httpx.Limits(max_keepalive_connections=0)) as client:
            yield running, client


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def completion(max_tokens: int = 3, **extra) -> dict:
    return {"prompt": "The quick brown fox", "max_tokens": max_tokens, **extra}


def metric(client: httpx.Client, name: str) -> float:
    text = client.get("/metrics").text
    found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


class OpenStream:
    """A completions stream that has received its first token: it is in flight."""

    def __init__(self, client: httpx.Client, timeout_s: float = TIMEOUT_S):
        self._cm = client.stream("POST", "/v1/completions", timeout=timeout_s,
                                 json=completion(max_tokens=100_000, stream=True))
        self.response = self._cm.__enter__()
        assert self.response.status_code == 200
        self._lines = self.response.iter_lines()
        self.first = next(line for line in self._lines if line.startswith("data: "))

    def rest(self) -> list[str]:
        """The remaining `data:` payloads, up to the end of the stream."""
        try:
            return sse_data("\n".join(self._lines))
        finally:
            self._cm.__exit__(None, None, None)


def assert_error_then_done(payloads: list[str], status: int | None = None) -> None:
    assert len(payloads) >= 2 and payloads[-1] == "[DONE]", payloads[-3:]
    error = json.loads(payloads[-2])["error"]
    assert error["message"]
    if status is not None:
        assert error["code"] == status, error


# -- 1. an add that raises ---------------------------------------------------

@pytest.mark.parametrize("failure, status", [
    (RuntimeError("add broke"), 500),
    (RequestError("this request cannot be added", "prompt"), 422),
])
def test_add_failure_rolls_back(core, failure, status):
    with serving(core) as (_, client):
        core.add_error = failure
        r = client.post("/v1/completions", json=completion())
        assert r.status_code == status, r.text
        assert r.json()["detail"][0]["msg"]  # the spec's error shape
        # The half-added request was aborted on the core: nothing stays live.
        assert len(core.adds) == 1 and core.aborts == [core.adds[0][0]]
        assert core.live == {}
        core.add_error = None
        r = client.post("/v1/completions", json=completion(max_tokens=2))
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


# -- 2. a step that raises ---------------------------------------------------

def test_step_failure_ends_requests_in_flight_and_serving_goes_on(core):
    with serving(core) as (_, client), ThreadPoolExecutor(1) as pool:
        stream = OpenStream(client)
        blocking = pool.submit(client.post, "/v1/completions", json=completion(max_tokens=100_000))
        wait_until(lambda: len(core.live) == 2, "both requests to be in flight")
        core.step_error = RuntimeError("a step broke")

        assert_error_then_done(stream.rest(), 500)
        r = blocking.result(timeout=TIMEOUT_S)
        assert r.status_code == 500, r.text
        assert r.json()["detail"][0]["type"] == "internal_error"
        assert core.live == {}

        assert metric(client, "amity_failure_by_error") == 2
        assert metric(client, "friendli_failure_by_cancel") == 0
        core.step_error = None
        assert client.get("/health").status_code == 200
        r = client.post("/v1/completions", json=completion(max_tokens=2))
        assert r.status_code == 200, r.text


# -- 3. a loop that dies -----------------------------------------------------

def test_dead_loop_ends_streams_fails_health_and_refuses_requests(core):
    with serving(core) as (_, client):
        assert client.get("/health").status_code == 200
        stream = OpenStream(client)
        core.die_with = LoopKilled("the loop was killed")
        assert_error_then_done(stream.rest(), 503)
        assert client.get("/health").status_code == 503
        r = client.post("/v1/completions", json=completion())
        assert r.status_code == 503, r.text


# -- 4. a shutdown with streams open -----------------------------------------

def test_shutdown_ends_open_streams_with_an_error_event(core):
    with serving(core) as (running, client):
        streams = [OpenStream(client), OpenStream(client)]
        # The drain waits shutdown_timeout (0.5 s), then the engine shuts down.
        running.server.should_exit = True
        for stream in streams:
            assert_error_then_done(stream.rest(), 503)


def test_shutdown_ends_open_streams_even_while_a_step_is_stuck(core):
    with serving(core) as (running, client):
        stream = OpenStream(client, timeout_s=3)
        core.hold = True
        try:
            assert core.holding.wait(TIMEOUT_S)
            running.server.should_exit = True
            assert_error_then_done(stream.rest(), 503)
        finally:
            core.release()  # the stuck step returns, so the server can stop


# -- 5. a list of prompts enters the engine together --------------------------

def test_prompt_list_reaches_the_core_before_its_first_step(core):
    with serving(core) as (_, client):
        r = client.post("/v1/completions",
                        json={"prompt": ["one", "two", "three"], "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 3
        ids = [request_id for request_id, _ in core.adds]
        assert len(ids) == 3
        assert {steps_before for _, steps_before in core.adds} == {0}
        assert sorted(core.step_batches[0]) == sorted(ids)


# -- 6. a request that can never be scheduled --------------------------------

def test_unschedulable_request_does_not_spin_the_loop(core):
    core.schedulable = False
    with serving(core) as (_, client), ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.post, "/v1/completions", json=completion(max_tokens=2))
        wait_until(lambda: core.step_calls >= 1, "the first step")
        calls = core.step_calls
        time.sleep(0.5)
        assert core.step_calls == calls, "the loop stepped again with nothing schedulable"

        # A new command (here, a second request) wakes the loop; both then run.
        core.schedulable = True
        r = client.post("/v1/completions", json=completion(max_tokens=2))
        assert r.status_code == 200, r.text
        assert waiting.result(timeout=TIMEOUT_S).status_code == 200


def test_unschedulable_request_wakes_the_loop_when_aborted(core):
    core.schedulable = False
    with serving(core) as (_, client):
        with pytest.raises(httpx.ReadTimeout):  # the client gives up: its request is aborted
            client.post("/v1/completions", json=completion(), timeout=0.5)
        request_id = core.adds[0][0]
        wait_until(lambda: request_id in core.aborts, "the abort to reach the core")
        calls = core.step_calls
        time.sleep(0.3)
        assert core.live == {} and core.step_calls == calls
        assert metric(client, "friendli_failure_by_cancel") == 1
        assert metric(client, "amity_failure_by_error") == 0


# -- 7. tokenization and chat templating off the event loop -------------------

class GatedTokenizer(Tokenizer):
    """Encoding a text that holds GATE blocks until `gate` is set: a tokenization that
    takes as long as the test wants (a 1 MB prompt's, without the megabyte)."""

    def __init__(self, tokenizer: Tokenizer):
        super().__init__(tokenizer.hf, set(tokenizer.eos_token_ids))
        self.entered, self.gate = threading.Event(), threading.Event()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if "GATE" in text:
            self.entered.set()
            assert self.gate.wait(TIMEOUT_S)
        return super().encode(text, add_special_tokens)


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", completion(prompt="GATE the quick brown fox")),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "GATE fox"}],
                              "max_tokens": 3}),
])
def test_a_slow_tokenization_never_stalls_other_requests(core, path, body):
    """Issue 13 (defect 14): tokenization and templating ran on the event loop, so
    while one request's prompt was tokenized nothing else was served."""
    core.tokenizer = GatedTokenizer(core.tokenizer)
    core.tokenizer.hf.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with serving(core) as (_, client), ThreadPoolExecutor(1) as pool:
        stream = OpenStream(client)
        gated = pool.submit(client.post, path, json=body)
        try:
            assert core.tokenizer.entered.wait(TIMEOUT_S)
            # The loop serves while the tokenizer is busy: a stalled loop would time out.
            assert client.get("/health", timeout=2).status_code == 200
            assert client.get("/metrics", timeout=2).status_code == 200
            before = core.num_steps
            wait_until(lambda: core.num_steps > before + 3, "the stream to keep stepping")
            assert next(line for line in stream._lines if line.startswith("data: "))
        finally:
            core.tokenizer.gate.set()
        r = gated.result(timeout=TIMEOUT_S)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "length"
        stream.response.close()
