"""Run by tests/suite/test_sdk_endpoints.py under .venv-sdk012 (friendli==0.12.8)
against a real `amity suite` process: all 12 lifecycle operations of dedicated
endpoints and the dedicated inference operations a generative model serves (chat
complete and stream, completions complete and stream, tokenize, detokenize,
messages, chat render), on a tiny model and on the default model.

Environment: SUITE_URL, SUITE_TOKEN, SUITE_PROJECT, TINY_REPO, WANDB_ARTIFACT.
"""

import os
import time

import pytest
from friendli import SyncFriendli
from friendli.core.utils.retries import RetryConfig

URL, TOKEN, PROJECT = os.environ["SUITE_URL"], os.environ["SUITE_TOKEN"], os.environ["SUITE_PROJECT"]
TINY_REPO, ARTIFACT = os.environ["TINY_REPO"], os.environ["WANDB_ARTIFACT"]
NO_RETRIES = RetryConfig("none", None, False)
ADVANCED = {"tokenizer_skip_special_tokens": True, "tokenizer_add_special_tokens": False}
MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def client():
    with SyncFriendli(token=TOKEN, server_url=URL, retry_config=NO_RETRIES,
                      timeout_ms=600_000) as c:
        yield c


def wait(client, endpoint_id: str, wanted: set[str], timeout_s: float = 600):
    deadline = time.monotonic() + timeout_s
    while True:
        status = client.dedicated.endpoint.get_status(endpoint_id=endpoint_id)
        if status.status in wanted:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.5)


def new_endpoint(client, name: str, repo: str) -> str:
    before = set(client.dedicated.endpoint.list(project_id=PROJECT, limit=100).data)
    status = client.dedicated.endpoint.create(
        project_id=PROJECT, name=name, instance_option_id="cpu", advanced=ADVANCED,
        hf_model_repo=repo, autoscaling_policy={"minReplica": 1, "maxReplica": 1,
                                                "cooldownPeriod": 60},
        initial_version_comment="created by the SDK")
    assert status.status == "INITIALIZING" and status.phase is not None
    [endpoint_id] = set(client.dedicated.endpoint.list(project_id=PROJECT, limit=100).data) - before
    return endpoint_id


def inference(client, endpoint_id: str) -> None:
    d = client.dedicated
    done = d.completions.complete(dedicated_completions_body={"model": endpoint_id, "prompt": "Hi",
                                                              "max_tokens": 3})
    assert done.model == endpoint_id and done.choices[0].text is not None
    # no `stream` in the body: the SDK's Accept header asks for the stream
    chunks = list(d.completions.stream(dedicated_completions_stream_body={
        "model": endpoint_id, "prompt": "Hi", "max_tokens": 3}))
    assert chunks and all(c.data is not None for c in chunks)
    chat = d.chat.complete(model=endpoint_id, messages=MESSAGES, max_tokens=3)
    assert chat.model == endpoint_id and chat.choices[0].message is not None
    streamed = list(d.chat.stream(model=endpoint_id, messages=MESSAGES, max_tokens=3))
    assert streamed and streamed[0].data.model == endpoint_id
    tokens = d.token.tokenize(model=endpoint_id, prompt="Hello").tokens
    assert d.token.detokenize(model=endpoint_id, tokens=tokens).text == "Hello"
    rendered = d.chat_render.render(model=endpoint_id, messages=MESSAGES)
    assert "Hi" in rendered.text
    answer = d.messages.messages(model=endpoint_id, messages=MESSAGES, max_tokens=3)
    assert answer.model == endpoint_id


def test_lifecycle_and_inference_on_a_tiny_model(client):
    e = client.dedicated.endpoint
    endpoint_id = new_endpoint(client, "sdk-tiny", TINY_REPO)
    assert wait(client, endpoint_id, {"RUNNING", "FAILED"}).status == "RUNNING"
    spec = e.get_spec(endpoint_id=endpoint_id)
    assert (spec.name, spec.autoscaling_min, spec.autoscaling_max, spec.project_id) == (
        "sdk-tiny", 1, 1, PROJECT)
    inference(client, endpoint_id)
    spec = e.update(endpoint_id=endpoint_id, name="sdk-renamed", new_version_comment="renamed")
    assert spec.name == "sdk-renamed"
    history = e.get_version_history(endpoint_id=endpoint_id)
    assert set(history.data) == {"0", "1"} and history.data["1"].name == "sdk-renamed"
    failing = new_endpoint(client, "sdk-unknown-repo", "nobody/nothing")
    status = wait(client, failing, {"FAILED", "RUNNING"})
    assert (status.status, status.error_code) == ("FAILED", "WORKLOAD_INIT_CANNOT_ACCESS_REPO_ERROR")
    page = e.list(project_id=PROJECT, limit=1)
    assert len(page.data) == 1 and page.next_cursor is not None
    rest = e.list(project_id=PROJECT, limit=1, cursor=page.next_cursor)  # sent back as b'...'
    assert set(page.data) | set(rest.data) == {endpoint_id, failing}
    e.delete(endpoint_id=failing)
    assert e.sleep(endpoint_id=endpoint_id).status == "SLEEPING"
    assert e.wake(endpoint_id=endpoint_id).status in ("AWAKING", "RUNNING")
    assert wait(client, endpoint_id, {"RUNNING", "FAILED"}).status == "RUNNING"
    assert e.terminate(endpoint_id=endpoint_id).status in ("TERMINATING", "TERMINATED")
    assert wait(client, endpoint_id, {"TERMINATED"}).status == "TERMINATED"
    assert e.restart(endpoint_id=endpoint_id).status == "INITIALIZING"
    assert wait(client, endpoint_id, {"RUNNING", "FAILED"}).status == "RUNNING"
    client.dedicated.token.tokenize(model=endpoint_id, prompt="x")
    e.delete(endpoint_id=endpoint_id)
    assert endpoint_id not in e.list(project_id=PROJECT, limit=100).data


def test_wandb_artifact_create_and_idempotent_rollout(client):
    e = client.dedicated.endpoint
    made = e.wandb_artifact_create(wandb_artifact_version_name=ARTIFACT, project_id=PROJECT,
                                   idempotency_key="sdk-key", name="from-wandb")
    assert (made.endpoint_name, made.project_id) == ("from-wandb", PROJECT)
    assert wait(client, made.endpoint_id, {"RUNNING", "FAILED"}).status == "RUNNING"
    again = e.wandb_artifact_create(wandb_artifact_version_name=ARTIFACT, project_id=PROJECT,
                                    idempotency_key="sdk-key")
    assert again.endpoint_id == made.endpoint_id  # rolled out, not created anew
    assert len(e.get_version_history(endpoint_id=made.endpoint_id).data) == 2
    e.delete(endpoint_id=made.endpoint_id)


def test_default_model(client):
    endpoint_id = new_endpoint(client, "sdk-default", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert wait(client, endpoint_id, {"RUNNING", "FAILED"}).status == "RUNNING"
    chat = client.dedicated.chat.complete(
        model=endpoint_id, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=8, temperature=0)
    assert chat.model == endpoint_id and chat.choices[0].message.content
    inference(client, endpoint_id)
    client.dedicated.endpoint.delete(endpoint_id=endpoint_id)
