"""The `ray` replica backend end to end: a real Ray head (`ray start --head`, its own
temporary directory, a process of this test) and a real `amity suite --replicas ray
--ray-address ...` whose replicas are Ray actors running `amity serve` of the tiny
chat model. Inference through the router, scale to zero on cooldown and wake on
request, a replica's actor killed mid-stream (the request fails cleanly, the actor is
replaced), delete, in one test, to start Ray once; and an address where no head
answers. `pytest -m ray` runs them alone."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.suite.conftest import ADMIN_TOKEN, REPO, free_port
from tests.suite.endpoint_fixtures import (build_registry, create_body, serve_pids, start_suite,
                                           wait_for, wait_status)

pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.ray]
BASE = "/dedicated/beta/endpoint"
HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(scope="module")
def ray_address():
    """A one-node Ray cluster; `--block` keeps `ray start` in the foreground, and
    stopping it stops every process of the cluster."""
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # Ray's socket paths must be short
    log = open(temp / "head.log", "w+")  # noqa: SIM115
    head = subprocess.Popen(
        # Ray's workers (the replicas' parents) run the Python that runs `ray start`
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
         "--port", str(free_port()), "--temp-dir", str(temp), "--num-cpus", "4",
         "--include-dashboard", "false", "--disable-usage-stats",
         "--object-store-memory", str(100 * 2**20)],
        stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"})
    try:
        cluster_file = temp / "ray_current_cluster"
        deadline = time.monotonic() + 300
        while not (cluster_file.exists() and "Ray runtime started" in log_text(log)):
            assert head.poll() is None and time.monotonic() < deadline, log_text(log)
            time.sleep(0.5)
        yield cluster_file.read_text().strip()
    finally:
        head.terminate()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def log_text(log) -> str:
    log.seek(0)
    return log.read()


@pytest.fixture(scope="module")
def suite(tmp_path_factory, tiny_llama_path, ray_address):
    registry = build_registry(tmp_path_factory.mktemp("registry"), tiny_llama_path)
    process = start_suite(tmp_path_factory.mktemp("ray-endpoints") / "data", registry,
                          "--replicas", "ray", "--ray-address", ray_address,
                          "--ray-replica-cpus", "1", timeout_s=180)
    process.project = process.admin_list()["projects"][0]["id"]
    process.http = httpx.Client(base_url=process.url, headers=HEADERS, timeout=300, trust_env=False)
    yield process
    process.http.close()
    process.stop()


def parent(pid: int) -> tuple[int, str]:
    """The parent of `pid`: its pid and its command line (a Ray worker names itself
    `ray::CLASS.METHOD` there)."""
    ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return ppid, Path(f"/proc/{ppid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def complete(suite, endpoint_id: str):
    return suite.http.post("/dedicated/v1/completions",
                           json={"model": endpoint_id, "prompt": "Hello", "max_tokens": 4})


def test_ray_replicas_serve_sleep_wake_and_are_replaced(suite):
    http = suite.http
    r = http.post(BASE, json=create_body(suite.project, autoscalingPolicy={
        "minReplica": 0, "maxReplica": 1, "cooldownPeriod": 2}))
    assert r.status_code == 200, r.text
    endpoint = r.json()["id"]
    assert wait_status(http, endpoint, {"RUNNING", "FAILED"})["status"] == "RUNNING"
    # the replica is a Ray actor's child, not the Suite's
    [pid] = serve_pids(endpoint)
    actor_pid, actor_cmdline = parent(pid)
    assert actor_pid != suite.proc.pid and actor_cmdline.startswith("ray::"), actor_cmdline
    done = complete(suite, endpoint)
    assert done.status_code == 200, done.text
    assert done.json()["model"] == endpoint and len(done.json()["choices"][0]["tokens"]) == 4

    # minReplica 0: idle past the cooldown, it sleeps, and its actor is gone
    wait_status(http, endpoint, {"SLEEPING"}, timeout_s=60)
    assert wait_for(lambda: not serve_pids(endpoint) and not running(actor_pid), 60,
                    "the replica and its actor stopping")
    # a request wakes it (a new actor) and is served
    r = complete(suite, endpoint)
    assert r.status_code == 200 and r.json()["model"] == endpoint, r.text

    # its actor killed mid-stream: the stream ends with an error event, never hangs;
    # a new actor replaces it
    r = http.put(f"{BASE}/{endpoint}", json={"autoscalingPolicy": {
        "minReplica": 1, "maxReplica": 1, "cooldownPeriod": 2}})
    assert r.status_code == 200, r.text
    body = {"model": endpoint, "prompt": "Once", "max_tokens": 400, "min_tokens": 400, "stream": True}
    with http.stream("POST", "/dedicated/v1/completions", json=body) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["model"] == endpoint
        [pid] = serve_pids(endpoint)
        actor_pid, actor_cmdline = parent(pid)
        assert actor_cmdline.startswith("ray::"), actor_cmdline
        os.kill(actor_pid, signal.SIGKILL)
        rest = list(lines)  # must end, not hang
    events = [line[6:] for line in rest if line.startswith("data: ")]
    assert events[-1] != "[DONE]" and "replica_error" in events[-1], events[-3:]
    assert wait_for(lambda: not running(pid), 30, "the replica dying with its actor")
    [new] = wait_for(lambda: [p for p in serve_pids(endpoint) if p != pid], 180, "a new replica")
    new_actor, new_cmdline = parent(new)
    assert new_actor != actor_pid and new_cmdline.startswith("ray::"), new_cmdline
    r = wait_for(lambda: (x := complete(suite, endpoint)).status_code == 200 and x, 300,
                 "serving again")
    assert r.json()["model"] == endpoint
    assert http.get(f"{BASE}/{endpoint}/status").json()["status"] == "RUNNING"

    assert http.delete(f"{BASE}/{endpoint}").json() == {}
    assert wait_for(lambda: not serve_pids(endpoint) and not running(new_actor), 60,
                    "the replica and its actor stopping")


def test_an_address_without_a_ray_head_is_a_clear_error(tmp_path):
    """(ray.init alone would retry it for minutes.)"""
    address = f"127.0.0.1:{free_port()}"
    result = subprocess.run(
        [sys.executable, "-m", "amity.cli", "suite", "--port", str(free_port()), "--data-dir",
         str(tmp_path / "data"), "--container-model", "none", "--replicas", "ray",
         "--ray-address", address], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
            str(REPO), os.environ.get("PYTHONPATH")])), "AMITY_ADMIN_TOKEN": ADMIN_TOKEN})
    assert result.returncode != 0
    assert f"--ray-address {address}: no Ray head answers there" in result.stderr, result.stderr
