"""`make serve`'s Suite: it starts a container of the default model and answers the
container's paths by forwarding them. What the container answers, the Suite answers,
byte for byte (per request ids and times aside), streams included; a killed
container is restarted."""

import json
import os
import re
import signal
from pathlib import Path

import httpx
import pytest

from tests.suite.conftest import SuiteProcess
from tests.suite.endpoint_fixtures import serve_pids, wait_for

pytestmark = pytest.mark.slow
VOLATILE = re.compile(rb'"(id|created|seed)":("[^"]*"|\d+)')


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    data = tmp_path_factory.mktemp("container") / "data"
    process = SuiteProcess(data, "--container-model", "HuggingFaceTB/SmolLM2-135M-Instruct",
                           "--replica-args", "--kv-cache-memory 64MiB --compile false",
                           "--autoscale-interval-s", "0.5")
    process.start(timeout_s=600)  # /health is 200 once the container has loaded
    yield process
    process.stop()


def container_url(data_dir: Path) -> str:
    [log] = sorted((data_dir / "replicas").glob("*.log"), key=lambda p: p.stat().st_mtime)[-1:]
    port = re.search(r"--port (\d+)", log.read_text().splitlines()[0]).group(1)
    return f"http://127.0.0.1:{port}"


def same(a: bytes, b: bytes) -> bool:
    return VOLATILE.sub(b"", a) == VOLATILE.sub(b"", b)


def test_the_suite_answers_what_the_container_answers(suite):
    direct = container_url(suite.data_dir)
    with httpx.Client(timeout=120, trust_env=False) as http:
        assert "amity suite: serving on" in suite.output
        for method, path, body in [
                ("GET", "/v1/models", None), ("GET", "/health", None),
                # a query, and a path with escapes, go on as they came
                ("GET", "/v1/models?x=%C3%A9", None), ("GET", "/v1/caf%C3%A9%3Fx", None),
                ("POST", "/v1/tokenize", {"prompt": "Hello there"}),
                ("POST", "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 6,
                                             "temperature": 0}),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                  "max_tokens": 5, "temperature": 0, "stream": True}),
                ("POST", "/v1/completions", {"prompt": "x", "max_tokens": -1}),  # the 422
                ("POST", "/v1/nope", {})]:
            theirs = http.request(method, direct + path, json=body)
            ours = http.request(method, suite.url + path, json=body)
            assert ours.status_code == theirs.status_code, (path, ours.text, theirs.text)
            assert ours.headers.get("content-type") == theirs.headers.get("content-type")
            assert same(ours.content, theirs.content), (path, ours.content[:300], theirs.content[:300])
        metrics = http.get(suite.url + "/metrics")
        assert metrics.status_code == 200 and "amity_" in metrics.text


def test_a_killed_container_is_restarted(suite):
    direct = container_url(suite.data_dir)
    port = direct.rsplit(":", 1)[1]
    pids = serve_pids("--port", port)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    wait_for(lambda: container_url(suite.data_dir) != direct
             and httpx.get(suite.url + "/health", trust_env=False).status_code == 200,
             300, "a new container")
    r = httpx.post(suite.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                   trust_env=False, timeout=120)
    assert r.status_code == 200 and json.loads(r.content)["choices"]
