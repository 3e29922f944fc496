"""Concurrency, client hang-ups and the queue limit, on the real engine."""

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.server.conftest import RunningServer, free_port, sse_data


def _metric(http, name: str) -> float:
    text = http.get("/metrics").text
    match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def test_twenty_concurrent_streams_finish(server):
    def one(i: int):
        path = "/v1/chat/completions" if i % 2 else "/v1/completions"
        body = {"max_tokens": 12, "stream": True, "seed": i,
                "stream_options": {"include_usage": True}}
        body |= ({"messages": [{"role": "user", "content": f"Count to {i}"}]} if i % 2
                 else {"prompt": f"Number {i} is"})
        with httpx.Client(base_url=server.url, timeout=300) as c:
            res = c.post(path, json=body)
        data = sse_data(res.text)
        chunks = [json.loads(d) for d in data[:-1]]
        finish = [c["choices"][0]["finish_reason"] for c in chunks
                  if c["choices"] and c["choices"][0].get("finish_reason")]
        return res.status_code, data[-1], finish, chunks[-1]["usage"]["completion_tokens"]

    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(one, range(20)))
    for status, last, finish, completion_tokens in results:
        assert status == 200 and last == "[DONE]"
        assert len(finish) == 1 and finish[0] in ("stop", "length")
        assert 1 <= completion_tokens <= 12


def test_hang_up_mid_stream_frees_blocks(server, http):
    cancels = _metric(http, "friendli_failure_by_cancel")
    body = {"prompt": "Tell me a very long story.", "max_tokens": 1500, "min_tokens": 1500,
            "stream": True}
    with httpx.Client(base_url=server.url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json=body) as res:
            lines = res.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            assert _metric(http, "amity_kv_blocks_used") > 0
    # The request would run for a long while; after the hang-up its blocks come back.
    deadline = time.time() + 10
    while time.time() < deadline and (
            _metric(http, "amity_kv_blocks_used") > 0 or server.engine.stats()["num_running"]):
        time.sleep(0.1)
    assert _metric(http, "amity_kv_blocks_used") == 0
    assert server.engine.stats()["num_running"] == 0
    assert _metric(http, "friendli_failure_by_cancel") == cancels + 1


def test_queue_limit_is_a_bound_on_requests_in_flight(engine, server):
    """Issue 13 (defect 6): the limit sampled the engine's waiting count from another
    thread, so a burst passed whole. With two slow requests in flight on a front end
    limited to two, each request of a burst gets a 503, exactly, and once they leave
    the next one is served."""
    limit, burst = 2, 3
    slow = {"prompt": "Tell me a very long story.", "max_tokens": 1500, "min_tokens": 1500,
            "stream": True}
    with RunningServer(engine, free_port(), max_queue_len=limit, owns_engine=False) as full, \
            httpx.Client(base_url=full.url, timeout=60) as c:
        held = []
        for _ in range(limit):
            cm = c.stream("POST", "/v1/completions", json=slow)
            res = cm.__enter__()
            assert res.status_code == 200
            lines = res.iter_lines()  # kept: a closed line iterator closes the response
            first = next(line for line in lines if line.startswith("data: "))
            assert '"error"' not in first, first
            held.append((cm, lines))
        try:
            assert _metric(c, "friendli_current_requests") == limit
            with ThreadPoolExecutor(burst) as pool:
                answers = list(pool.map(lambda _: httpx.post(
                    full.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                    timeout=60), range(burst)))
            assert [r.status_code for r in answers] == [503] * burst
            assert all(r.headers["retry-after"] and "saturated" in r.json()["detail"][0]["msg"]
                       for r in answers)
            assert _metric(c, "friendli_failure_by_reject") == burst
        finally:
            for cm, _ in held:  # hang up: their admissions end
                cm.__exit__(None, None, None)
        deadline = time.time() + 10
        while _metric(c, "friendli_current_requests") and time.time() < deadline:
            time.sleep(0.05)
        res = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
        assert res.status_code == 200, res.text
        assert _metric(c, "friendli_failure_by_reject") == burst
