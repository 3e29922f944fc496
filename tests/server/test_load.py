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


def test_queue_limit_answers_503(engine, server):
    # A second front end on the same engine whose queue limit is already reached.
    with RunningServer(engine, free_port(), max_queue_len=0, owns_engine=False) as full:
        res = httpx.post(full.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1})
        assert res.status_code == 503 and res.headers["retry-after"]
        assert "saturated" in res.json()["detail"][0]["msg"]
        assert httpx.get(full.url + "/metrics").text.count("friendli_failure_by_reject 1.0")
    assert httpx.post(server.url + "/v1/completions",
                      json={"prompt": "hi", "max_tokens": 1}).status_code == 200
