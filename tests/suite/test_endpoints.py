"""Dedicated endpoints end to end: a real `amity suite` process whose replicas are
real `amity serve` processes of a tiny random-weight chat model, driven over real
sockets. The lifecycle and its state machine, inference through the router
(streaming, the Accept rule, `model` = endpoint id), sleep on cooldown and wake on
request, kill -9 of a replica, scale-out under load and back, cross-team 404s, and a
restart of the Suite that brings the endpoints back."""

import asyncio
import json
import os
import signal
import socket
import threading
from pathlib import Path

import httpx
import pytest

from amity.config import StoreConfig
from amity.suite.store.database import open_database
from tests.suite.conftest import ADMIN_TOKEN, make_account
from tests.suite.endpoint_fixtures import (build_registry, create_body, serve_pids, start_suite,
                                           wait_for, wait_status)

pytestmark = pytest.mark.slow
BASE = "/dedicated/beta/endpoint"
HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(scope="module")
def registry(tmp_path_factory, tiny_llama_path):
    return build_registry(tmp_path_factory.mktemp("registry"), tiny_llama_path)


@pytest.fixture(scope="module")
def suite(tmp_path_factory, registry):
    process = start_suite(tmp_path_factory.mktemp("endpoints") / "data", registry)
    process.registry = registry
    listing = process.admin_list()
    process.project = listing["projects"][0]["id"]
    process.http = httpx.Client(base_url=process.url, headers=HEADERS, timeout=300, trust_env=False)
    yield process
    process.http.close()
    if process.proc.poll() is None:
        process.stop()


def create(suite, **extra) -> str:
    r = suite.http.post(BASE, json=create_body(suite.project, **extra))
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "INITIALIZING"
    return r.json()["id"]


def replica_pids(endpoint_id: str) -> list[int]:
    return serve_pids(endpoint_id)  # replicas serve under the endpoint id


def replica_argv(pid: int, flag: str) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return argv[argv.index(flag.encode()) + 1].decode()


def replica_socket(suite, endpoint_id: str) -> Path:
    """The Unix socket the Suite reaches the endpoint's one replica through: in the
    Suite's data directory, and there while the replica runs."""
    [pid] = replica_pids(endpoint_id)
    path = Path(replica_argv(pid, "--uds"))
    assert path.parent == suite.data_dir / "replicas" and path.is_socket()
    return path


def complete(suite, endpoint_id: str, **body):
    return suite.http.post("/dedicated/v1/completions",
                           json={"model": endpoint_id, "prompt": "Hello", "max_tokens": 4, **body})


def sse_events(text: str) -> list[str]:
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


def test_lifecycle_inference_and_invalid_transitions(suite):
    http = suite.http
    endpoint = create(suite, autoscalingPolicy={"minReplica": 1, "maxReplica": 1,
                                                "cooldownPeriod": 60},
                      initialVersionComment="first")
    assert wait_status(http, endpoint, {"RUNNING", "FAILED"})["status"] == "RUNNING"
    spec = http.get(f"{BASE}/{endpoint}").json()
    assert (spec["name"], spec["autoscalingMin"], spec["autoscalingMax"], spec["currReplicaCnt"],
            spec["projectId"], spec["gpuType"]) == ("tiny", 1, 1, 1, suite.project, "CPU")
    first_socket = replica_socket(suite, endpoint)

    # inference: `model` is the endpoint id, in and out
    done = complete(suite, endpoint)
    assert done.status_code == 200, done.text
    assert done.json()["model"] == endpoint and len(done.json()["choices"][0]["tokens"]) == 4
    chat = {"model": endpoint, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    r = http.post("/dedicated/v1/chat/completions", json=chat)
    assert r.status_code == 200 and r.json()["model"] == endpoint, r.text
    # no `stream` field + Accept preferring SSE: a stream (friendli 0.12.8's stream())
    r = http.post("/dedicated/v1/chat/completions", json=chat, headers={"Accept": "text/event-stream"})
    assert r.headers["content-type"].startswith("text/event-stream"), r.text
    events = sse_events(r.text)
    assert events[-1] == "[DONE]" and json.loads(events[0])["model"] == endpoint
    # 0.16.5's habit: JSON preferred, `"stream": true` in the body: a stream too
    r = http.post("/dedicated/v1/completions", json={"model": endpoint, "prompt": "a", "max_tokens": 2,
                                                     "stream": True},
                  headers={"Accept": "application/json;q=1, text/event-stream;q=0"})
    assert sse_events(r.text)[-1] == "[DONE]"
    # an explicit `"stream": false` wins over the Accept header
    r = http.post("/dedicated/v1/chat/completions", json={**chat, "stream": False},
                  headers={"Accept": "text/event-stream"})
    assert r.headers["content-type"].startswith("application/json") and r.json()["choices"]
    tokens = http.post("/dedicated/v1/tokenize", json={"model": endpoint, "prompt": "Hello"}).json()
    text = http.post("/dedicated/v1/detokenize", json={"model": endpoint, "tokens": tokens["tokens"]})
    assert text.json()["text"] == "Hello"
    render = http.post("/dedicated/v1/chat/render", json={"model": endpoint, "messages": chat["messages"]})
    assert render.status_code == 200 and "<|user|>Hi" in render.text
    messages = http.post("/dedicated/v1/messages", json={"model": endpoint, "max_tokens": 3,
                                                         "messages": chat["messages"]})
    assert messages.status_code == 200 and messages.json()["model"] == endpoint, messages.text
    # what the replica cannot serve answers the replica's own 4xx
    assert http.post("/dedicated/v1/embeddings", json={"model": endpoint, "input": "x"}).status_code // 100 == 4
    assert complete(suite, f"{endpoint}:no-such-adapter").status_code == 404
    # the router's own refusals
    assert complete(suite, "ep_nope").status_code == 404
    assert http.post("/dedicated/v1/completions", json={"prompt": "x"}).status_code == 422
    assert http.post("/dedicated/v1/completions", content=b"{", headers={
        "content-type": "application/json"}).status_code == 422
    assert httpx.post(f"{suite.url}/dedicated/v1/completions", json={"model": endpoint},
                      trust_env=False).status_code == 401

    # update without a new replica: the spec changes, a version is added
    r = http.put(f"{BASE}/{endpoint}", json={"name": "renamed", "newVersionComment": "second"})
    assert r.status_code == 200 and r.json()["name"] == "renamed", r.text
    assert wait_status(http, endpoint, {"RUNNING"})["status"] == "RUNNING"
    # update of `advanced`: the replicas roll (UPDATING -> RUNNING)
    r = http.put(f"{BASE}/{endpoint}", json={"advanced": {**create_body("")["advanced"],
                                                          "max_batch_size": 4}})
    assert r.status_code == 200 and r.json()["maxBatchSize"] == 4
    assert http.get(f"{BASE}/{endpoint}/status").json()["status"] == "UPDATING"
    assert http.put(f"{BASE}/{endpoint}", json={"name": "x"}).status_code == 400  # mid-update
    assert wait_status(http, endpoint, {"RUNNING", "FAILED"})["status"] == "RUNNING"
    history = http.get(f"{BASE}/{endpoint}/version").json()["data"]
    assert list(history) == ["0", "1", "2"]
    assert [history[k]["versionComment"] for k in history] == ["first", "second", None]
    assert history["0"]["name"] == "tiny" and history["2"]["maxBatchSize"] == 4
    page = http.get(f"{BASE}/{endpoint}/version", params={"limit": 2}).json()
    assert list(page["data"]) == ["0", "1"] and page["nextCursor"]
    rest = http.get(f"{BASE}/{endpoint}/version", params={"cursor": f"b'{page['nextCursor']}'"})
    assert list(rest.json()["data"]) == ["2"] and rest.json()["nextCursor"] is None
    assert complete(suite, endpoint).status_code == 200

    # invalid transitions are 400s (never a 503 that clients would retry for an hour)
    assert http.put(f"{BASE}/{endpoint}/restart").status_code == 400
    assert http.put(f"{BASE}/{endpoint}/wake").json()["status"] == "RUNNING"  # a no-op
    r = http.put(f"{BASE}/{endpoint}/terminate")
    assert r.status_code == 200 and r.json()["status"] in ("TERMINATING", "TERMINATED")
    wait_status(http, endpoint, {"TERMINATED"})
    assert wait_for(lambda: not replica_pids(endpoint), 60, "the replica stopping")
    assert not first_socket.exists()  # gone with its replica
    assert http.put(f"{BASE}/{endpoint}/terminate").status_code == 400
    assert http.put(f"{BASE}/{endpoint}/sleep").status_code == 400
    assert http.put(f"{BASE}/{endpoint}/wake").status_code == 400
    assert complete(suite, endpoint).status_code == 400
    assert http.get(f"{BASE}/{endpoint}").json()["name"] == "renamed"  # configuration kept
    r = http.put(f"{BASE}/{endpoint}/restart")
    assert r.status_code == 200 and r.json()["status"] == "INITIALIZING"
    assert wait_status(http, endpoint, {"RUNNING", "FAILED"})["status"] == "RUNNING"
    assert complete(suite, endpoint).json()["model"] == endpoint
    assert http.delete(f"{BASE}/{endpoint}").json() == {}
    assert http.get(f"{BASE}/{endpoint}").status_code == 404
    assert complete(suite, endpoint).status_code == 404
    assert wait_for(lambda: not replica_pids(endpoint), 60, "the replica stopping")


def test_unknown_repo_fails_and_list_paginates(suite):
    http = suite.http
    failed = create(suite, hfModelRepo="nobody/nothing")
    status = wait_status(http, failed, {"FAILED", "RUNNING"})
    assert (status["status"], status["errorCode"]) == ("FAILED", "WORKLOAD_INIT_CANNOT_ACCESS_REPO_ERROR")
    bad_revision = create(suite, hfModelRepoRevision="abc")  # a plain directory has no revisions
    assert wait_status(http, bad_revision, {"FAILED", "RUNNING"})["status"] == "FAILED"
    assert http.put(f"{BASE}/{failed}/sleep").status_code == 400
    assert complete(suite, failed).status_code == 400
    seen, cursor = {}, None
    while True:
        page = http.get(BASE, params={"limit": 1, **({"cursor": cursor} if cursor else {})}).json()
        assert len(page["data"]) <= 1
        seen.update(page["data"])
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert {failed, bad_revision} <= set(seen) and seen[failed]["status"] == "FAILED"
    assert failed in http.get(BASE, params={"project_id": suite.project}).json()["data"]
    assert http.get(BASE, params={"project_id": "proj_other"}).json()["data"] == {}
    for body in (create_body(suite.project, instanceOptionId="nope"),
                 create_body(suite.project, autoscalingPolicy={"minReplica": 3, "maxReplica": 2}),
                 create_body(suite.project, simplescale={"replicas": 1},
                             autoscalingPolicy={"minReplica": 1}),
                 {**create_body(suite.project), "advanced": {}}):
        assert http.post(BASE, json=body).status_code == 422, body


def test_another_team_gets_404_on_every_operation(suite):
    sessions = open_database(StoreConfig(str(suite.data_dir)))
    other = make_account(sessions, "endpoint-outsider")
    mine = create(suite, hfModelRepo="nobody/nothing")  # no replica needed
    wait_status(suite.http, mine, {"FAILED"})
    theirs = httpx.Client(base_url=suite.url, headers=other.headers, timeout=60, trust_env=False)
    ops = [("GET", f"{BASE}/{mine}", None), ("PUT", f"{BASE}/{mine}", {"name": "x"}),
           ("DELETE", f"{BASE}/{mine}", None), ("GET", f"{BASE}/{mine}/version", None),
           ("GET", f"{BASE}/{mine}/status", None), ("PUT", f"{BASE}/{mine}/sleep", None),
           ("PUT", f"{BASE}/{mine}/wake", None), ("PUT", f"{BASE}/{mine}/terminate", None),
           ("PUT", f"{BASE}/{mine}/restart", None),
           ("POST", BASE, create_body(suite.project)),
           ("POST", "/dedicated/endpoint/wandb-artifact-create",
            {"wandbArtifactVersionName": "acme/reg/m:v0", "projectId": suite.project})]
    ops += [("POST", f"/dedicated{path}", {"model": mine, "prompt": "x", "messages": [],
                                           "tokens": [1], "input": "x"})
            for path in ("/v1/chat/completions", "/v1/chat/render", "/v1/messages",
                         "/v1/completions", "/v1/embeddings", "/v1/tokenize", "/v1/detokenize",
                         "/v1/images/generations", "/v1/images/edits", "/v1/audio/transcriptions",
                         "/classify")]
    for method, path, body in ops:
        r = theirs.request(method, path, json=body)
        assert r.status_code == 404, (method, path, r.status_code, r.text)
    assert mine not in theirs.get(BASE).json()["data"]
    assert suite.http.get(f"{BASE}/{mine}").status_code == 200  # untouched


def test_sleep_on_cooldown_then_wake_on_request(suite):
    http = suite.http
    endpoint = create(suite, autoscalingPolicy={"minReplica": 0, "maxReplica": 1,
                                                "cooldownPeriod": 2})
    assert wait_status(http, endpoint, {"RUNNING", "FAILED"})["status"] == "RUNNING"
    wait_status(http, endpoint, {"SLEEPING"}, timeout_s=60)
    assert wait_for(lambda: not replica_pids(endpoint), 60, "the replica stopping")
    assert http.get(f"{BASE}/{endpoint}").json()["currReplicaCnt"] == 0
    # a request wakes it, waits, and is served
    seen = []
    watcher = threading.Thread(target=lambda: seen.append(wait_status(
        httpx.Client(base_url=suite.url, headers=HEADERS, trust_env=False), endpoint, {"AWAKING"})))
    watcher.start()
    r = complete(suite, endpoint)
    assert r.status_code == 200 and r.json()["model"] == endpoint, r.text
    watcher.join(timeout=60)
    assert seen and seen[0]["phase"] == "ENGINE_INITIALIZING"
    assert http.get(f"{BASE}/{endpoint}/status").json()["status"] == "RUNNING"
    # manual sleep and wake
    assert http.put(f"{BASE}/{endpoint}/sleep").json()["status"] == "SLEEPING"
    r = http.put(f"{BASE}/{endpoint}/wake")
    assert r.json()["status"] in ("AWAKING", "RUNNING")
    assert wait_status(http, endpoint, {"RUNNING", "FAILED"})["status"] == "RUNNING"
    http.put(f"{BASE}/{endpoint}/sleep")
    suite.sleeping = endpoint  # the restart test checks that it stays asleep


def test_kill_9_of_a_replica_fails_its_request_and_is_replaced(suite):
    http = suite.http
    endpoint = create(suite, simplescale={"replicas": 1})
    assert wait_status(http, endpoint, {"RUNNING", "FAILED"})["status"] == "RUNNING"
    [pid] = replica_pids(endpoint)
    killed_socket = replica_socket(suite, endpoint)
    body = {"model": endpoint, "prompt": "Once", "max_tokens": 400, "min_tokens": 400, "stream": True}
    with http.stream("POST", "/dedicated/v1/completions", json=body) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["model"] == endpoint
        os.kill(pid, signal.SIGKILL)
        rest = list(lines)  # must end, not hang
    events = sse_events("\n".join(rest))
    assert events[-1] != "[DONE]" and "replica_error" in events[-1], events[-3:]
    new = wait_for(lambda: [p for p in replica_pids(endpoint) if p != pid], 120, "a new replica")
    assert new
    r = wait_for(lambda: (x := complete(suite, endpoint)).status_code == 200 and x, 300,
                 "serving again")
    assert r.json()["model"] == endpoint
    assert http.get(f"{BASE}/{endpoint}/status").json()["status"] == "RUNNING"
    assert not killed_socket.exists()  # the Suite removed what the killed replica left
    suite.running = endpoint


def replica_metrics(endpoint_id: str) -> dict[str, float]:
    """The Prometheus samples of the endpoint's one replica, read straight from it."""
    [pid] = replica_pids(endpoint_id)
    port = int(replica_argv(pid, "--port"))
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", trust_env=False).text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def test_forty_concurrent_non_streamed_requests_all_reach_the_replica(suite):
    """Authentication gives its database connection back before the request is
    forwarded: more concurrent requests than the pool has connections (5 + 10) are all
    at the replica at once, and all succeed."""
    endpoint = suite.running  # one replica, taking up to 64 requests at once
    body = {"model": endpoint, "prompt": "Once", "max_tokens": 480, "min_tokens": 480}

    async def run() -> tuple[list[httpx.Response], float]:
        peak = 0.0
        async with httpx.AsyncClient(base_url=suite.url, headers=HEADERS, timeout=600,
                                     trust_env=False) as client:
            requests = [asyncio.ensure_future(client.post("/dedicated/v1/completions", json=body))
                        for _ in range(40)]
            while not all(r.done() for r in requests):
                metrics = await asyncio.to_thread(replica_metrics, endpoint)
                peak = max(peak, metrics["friendli_current_requests"])
                await asyncio.sleep(0.1)
            return [r.result() for r in requests], peak

    answers, peak = asyncio.run(run())
    assert [a.status_code for a in answers] == [200] * 40, next(a.text for a in answers
                                                               if a.status_code != 200)
    assert all(len(a.json()["choices"][0]["tokens"]) == 480 for a in answers)
    assert peak == 40


def test_a_client_disconnect_cancels_a_non_streamed_request_at_the_replica(suite):
    endpoint = suite.running
    before = replica_metrics(endpoint)
    body = json.dumps({"model": endpoint, "prompt": "Once", "max_tokens": 480,
                       "min_tokens": 480}).encode()
    with socket.create_connection(("127.0.0.1", suite.port)) as client:
        client.sendall(b"POST /dedicated/v1/completions HTTP/1.1\r\nHost: suite\r\n"
                       b"Authorization: Bearer " + ADMIN_TOKEN.encode() + b"\r\n"
                       b"Content-Type: application/json\r\nContent-Length: "
                       + str(len(body)).encode() + b"\r\n\r\n" + body)
        wait_for(lambda: replica_metrics(endpoint)["friendli_current_requests"] == 1, 120,
                 "the request reaching the replica")
    # the client is gone: the replica aborts the request rather than finishing it
    after = wait_for(lambda: (m := replica_metrics(endpoint))["friendli_current_requests"] == 0
                     and m, 120, "the replica dropping the request")
    assert after["friendli_failure_by_cancel"] == before["friendli_failure_by_cancel"] + 1
    assert after["friendli_responses_total"] == before["friendli_responses_total"]


def test_a_client_disconnect_mid_stream_cancels_the_request_at_the_replica(suite):
    """The relay watches for the client's hang-up while it streams: the replica aborts
    the request rather than generating the rest."""
    endpoint = suite.running
    before = replica_metrics(endpoint)
    body = json.dumps({"model": endpoint, "prompt": "Once", "max_tokens": 480,
                       "min_tokens": 480, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", suite.port)) as client:
        client.sendall(b"POST /dedicated/v1/completions HTTP/1.1\r\nHost: suite\r\n"
                       b"Authorization: Bearer " + ADMIN_TOKEN.encode() + b"\r\n"
                       b"Content-Type: application/json\r\nContent-Length: "
                       + str(len(body)).encode() + b"\r\n\r\n" + body)
        received = b""
        while b"data: " not in received:  # the stream has begun: the relay is in its loop
            received += client.recv(65536)
        assert received.startswith(b"HTTP/1.1 200"), received[:200]
    after = wait_for(lambda: (m := replica_metrics(endpoint))["friendli_current_requests"] == 0
                     and m, 120, "the replica dropping the request")
    assert after["friendli_failure_by_cancel"] == before["friendli_failure_by_cancel"] + 1
    assert after["friendli_responses_total"] == before["friendli_responses_total"]


def test_scale_out_under_load_and_back(suite):
    http = suite.http
    endpoint = create(suite, autoscalingPolicy={"minReplica": 1, "maxReplica": 2,
                                                "cooldownPeriod": 3})
    assert wait_status(http, endpoint, {"RUNNING", "FAILED"})["status"] == "RUNNING"
    body = {"model": endpoint, "prompt": "Once", "max_tokens": 300, "min_tokens": 300}
    stop = threading.Event()

    def load():
        with httpx.Client(base_url=suite.url, headers=HEADERS, timeout=300, trust_env=False) as c:
            while not stop.is_set():
                assert c.post("/dedicated/v1/completions", json=body).status_code == 200

    workers = [threading.Thread(target=load) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        wait_for(lambda: http.get(f"{BASE}/{endpoint}").json()["currReplicaCnt"] == 2, 300,
                 "scale-out to 2 replicas")
        assert len(replica_pids(endpoint)) == 2
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=300)
    wait_for(lambda: http.get(f"{BASE}/{endpoint}").json()["currReplicaCnt"] == 1, 120,
             "scale-in to 1 replica after the cooldown")
    assert wait_for(lambda: len(replica_pids(endpoint)) == 1, 60, "the extra replica stopping")
    assert http.delete(f"{BASE}/{endpoint}").status_code == 200


def test_restart_of_the_suite_brings_endpoints_back(suite):
    """Runs last: it restarts the module's Suite."""
    running, sleeping = suite.running, getattr(suite, "sleeping", None)
    suite.stop()
    assert wait_for(lambda: not replica_pids(running), 60, "the replicas stopping with the Suite")
    suite.start()
    http = suite.http
    assert http.get(f"{BASE}/{running}/status").json()["status"] in ("INITIALIZING", "RUNNING")
    assert wait_status(http, running, {"RUNNING", "FAILED"})["status"] == "RUNNING"
    assert complete(suite, running).json()["model"] == running
    if sleeping:
        assert http.get(f"{BASE}/{sleeping}/status").json()["status"] == "SLEEPING"
        assert not replica_pids(sleeping)
    assert http.get(f"{BASE}/{running}/version").json()["data"].keys() == {"0"}
