"""Shared replicas of catalog models, started by the Suite itself (no
--serverless-model-urls): started by a first request, answering under the catalog id,
streamed by the Accept rule; a `scale-to-zero` model stops after its cooldown and the
next request starts it again, while an `always-on` one keeps running."""

import time

import pytest

from tests.suite.conftest import start_in_process
from tests.suite.tools.conftest import DEFAULT_MODEL_ENTRY

pytestmark = pytest.mark.slow  # three replica starts of the default model

ON, ZERO = "acme/always", "acme/zero"
COOLDOWN_S = 3.0


@pytest.fixture
def suite(tmp_path):
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(DEFAULT_MODEL_ENTRY.format(id=ON, replicas="always-on")
                       + DEFAULT_MODEL_ENTRY.format(id=ZERO, replicas="scale-to-zero"))
    running = start_in_process(tmp_path / "suite", catalog=str(catalog),
                               serverless_cooldown_s=COOLDOWN_S, autoscale_interval_s=0.2,
                               wake_timeout_s=900, replica_args="--kv-cache-memory 64MiB --compile false")
    yield running
    running.client.__exit__(None, None, None)


def complete(suite, model: str) -> dict:
    response = suite.client.post("/serverless/v1/completions", headers=suite.admin.headers,
                                 json={"model": model, "prompt": "Hello", "max_tokens": 2})
    assert response.status_code == 200, response.text
    return response.json()


def replica_sets(suite) -> dict:
    return {name: s for name, (s, _) in suite.client.app.state.replicas.named.items()}


def test_started_on_first_use_then_scaled_to_zero_unless_always_on(suite):
    assert replica_sets(suite) == {}  # nothing loads before it is used
    assert complete(suite, ON)["model"] == ON
    assert complete(suite, ZERO)["model"] == ZERO
    sets = replica_sets(suite)
    assert set(sets) == {"serverless:" + ON, "serverless:" + ZERO}
    (zero_replica,) = sets["serverless:" + ZERO].replicas

    # The Accept header alone asks for a stream (no `stream` field in the body).
    with suite.client.stream("POST", "/serverless/v1/chat/completions",
                             headers={**suite.admin.headers, "Accept": "text/event-stream"},
                             json={"model": ON, "max_tokens": 2,
                                   "messages": [{"role": "user", "content": "Hi"}]}) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in stream.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]" and f'"model":"{ON}"' in lines[0].replace(" ", "")

    deadline = time.monotonic() + COOLDOWN_S + 120
    # Gone from the sets, then its process ends (SIGTERM, a graceful stop).
    while "serverless:" + ZERO in replica_sets(suite) or zero_replica.handle.returncode is None:
        assert time.monotonic() < deadline, "the scale-to-zero model never stopped"
        time.sleep(0.5)
    (on_replica,) = replica_sets(suite)["serverless:" + ON].replicas
    assert on_replica.handle.returncode is None

    assert complete(suite, ZERO)["model"] == ZERO  # started again
    (restarted,) = replica_sets(suite)["serverless:" + ZERO].replicas
    assert restarted is not zero_replica
