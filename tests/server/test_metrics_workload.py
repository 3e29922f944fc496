"""`/metrics` after a scripted workload: every Friendli counter equals what was sent.

A fresh `amity serve` process of its own (the session server is shared, so its counters
hold other tests' traffic), started through the CLI with a metrics port of its own,
`--max-num-seqs 1` (one sequence runs, the next waits) and `--max-queue-len 1` (once
one request waits, the next gets a 503): so a rejection can be provoked on purpose,
not by racing.

The workload, in order, and what each part must count:

* 6 successes on every generating API (a 2-prompt completion among them, a stream
  with usage, a repeated prompt that hits the prefix cache): `requests`, `responses`,
  `items` (choices: the 2-prompt one asks for 2), one observation each in the
  `input_lengths` / `output_lengths` / `tcache_hit_ratio` histograms (a wire request's
  prompts summed, as its `usage` reports them), `latencies` and `ttft`.
* A 422 found by the schema (`max_tokens: -1`) and a 404 (unknown `model`): never
  generation requests, they count nowhere.
* A 422 found by the engine (`max_tokens` past the context length): the request was
  admitted and tracked before the engine refused it, so it counts in `requests` and
  `items` (not in `queueing_delays`: it never queued) but is neither a response nor a cancel nor a
  reject: none of Friendli's failure counters describes bad input.
* 3 client hang-ups: one while queued behind another request (no token yet: no
  `ttft`), one mid-stream, one mid-generation of a non-streaming request: each a
  `failure_by_cancel`, a request and an item, never a response.
* 2 rejects (503 while one request waits): `requests` and `failure_by_reject`, not
  `items` (no sequence was ever made for them), no histogram or summary.
"""

import json
import socket
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import free_port, sse_data
from tests.server.test_process import START_LINE, START_TIMEOUT, ServerProcess

MAX_TOKENS = 4  # every successful request generates exactly this many tokens per prompt
LONG_TOKENS = 1000  # the requests that are hung up on: far more than they get to make
SETTLE_TIMEOUT = 30
LENGTH_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
# Two blocks (16 tokens each) and more: sent twice, the second time its first blocks
# come from the prefix cache.
CACHED_PROMPT = ("The quick brown fox jumps over the lazy dog near the river bank, "
                 "while seven small birds sing songs about the morning sun and the wind")


def parse(text: str) -> dict[str, float]:
    """Every sample, as `name` or `name{label="value",...}` -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name
            if sample.labels:
                key += "{" + ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items())) + "}"
            out[key] = sample.value
    return out


@pytest.fixture(scope="module")
def served():
    port, metrics_port = free_port(), free_port()
    while metrics_port == port:
        metrics_port = free_port()
    with ServerProcess("--port", str(port), "--metrics-port", str(metrics_port),
                       "--max-num-seqs", "1", "--max-queue-len", "2",
                       "--kv-cache-memory", "128MiB", "--compile", "false") as sp:
        sp.url = f"http://127.0.0.1:{port}"
        sp.metrics_url = f"http://127.0.0.1:{metrics_port}"
        sp.poll_health_until_ready(sp.url, START_TIMEOUT)
        sp.wait_for_line(START_LINE, 30)
        yield sp
        code = sp.terminate_and_wait()
        assert code == 0, f"exit code {code}; output:\n{sp.output()[-4000:]}"


def scrape(url: str) -> dict[str, float]:
    res = httpx.get(f"{url}/metrics", timeout=10)
    assert res.status_code == 200, res.text
    return parse(res.text)


def wait_for(url: str, what: str, ok) -> dict[str, float]:
    """Scrape until `ok(samples)` holds: a hang-up is noticed by the server a moment
    after the client leaves, so the counters settle shortly after, not at once."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        samples = scrape(url)
        if ok(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"/metrics never showed {what}; last scrape: {samples}")
        time.sleep(0.05)


def raw_post(url: str, path: str, body: dict) -> socket.socket:
    """Send a request and return its open socket without reading the answer: closing
    the socket is the client hanging up, at a moment the test chooses."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


class Tally:
    """What the workload sent, as the metrics must count it."""

    def __init__(self):
        self.requests = self.items = 0
        self.cancels = self.rejects = 0
        self.ttft = self.queueing = 0
        self.finished: list[tuple[int, int, int]] = []  # (prompt, output, cached) tokens

    def success(self, prompt: int, output: int, cached: int, items: int = 1) -> None:
        self.requests += 1
        self.items += items
        self.ttft += 1
        self.queueing += 1
        self.finished.append((prompt, output, cached))


def _openai_usage(usage: dict) -> tuple[int, int, int]:
    return (usage["prompt_tokens"], usage["completion_tokens"],
            usage["prompt_tokens_details"]["cached_tokens"])


@pytest.fixture(scope="module")
def workload(served) -> Tally:
    url = served.url
    tally = Tally()
    fixed = {"max_tokens": MAX_TOKENS, "min_tokens": MAX_TOKENS}
    with httpx.Client(base_url=url, timeout=120) as http:
        before = scrape(url)
        assert before["friendli_requests_total"] == 0, "the server is not fresh"

        # Successes, one per API, sequentially.
        for _ in range(2):  # the second is served partly from the prefix cache
            res = http.post("/v1/completions", json={"prompt": CACHED_PROMPT, **fixed})
            assert res.status_code == 200, res.text
            tally.success(*_openai_usage(res.json()["usage"]))
        assert tally.finished[1][2] > 0, "the repeated prompt did not hit the prefix cache"

        res = http.post("/v1/completions", json={"prompt": ["One, two,", "Red, green,"], **fixed})
        assert res.status_code == 200, res.text
        assert len(res.json()["choices"]) == 2
        tally.success(*_openai_usage(res.json()["usage"]), items=2)
        assert tally.finished[-1][1] == 2 * MAX_TOKENS

        res = http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Say hello."}], **fixed})
        assert res.status_code == 200, res.text
        tally.success(*_openai_usage(res.json()["usage"]))

        res = http.post("/v1/completions", json={
            "prompt": "Once upon a time", "stream": True,
            "stream_options": {"include_usage": True}, **fixed})
        data = sse_data(res.text)
        assert res.status_code == 200 and data[-1] == "[DONE]", res.text[-500:]
        tally.success(*_openai_usage(json.loads(data[-2])["usage"]))

        res = http.post("/v1/messages", json={
            "max_tokens": MAX_TOKENS, "messages": [{"role": "user", "content": "Hi"}]})
        assert res.status_code == 200, res.text
        usage = res.json()["usage"]
        cached = usage["cache_read_input_tokens"] or 0
        # Anthropic's meaning: the prompt is input_tokens + cache_read_input_tokens.
        tally.success(usage["input_tokens"] + cached, usage["output_tokens"], cached)
        assert all(output > 0 for _, output, _ in tally.finished)

        # Bad requests. The schema's 422 and the 404 never become generation requests.
        res = http.post("/v1/completions", json={"prompt": "x", "max_tokens": -1})
        assert res.status_code == 422, res.text
        res = http.post("/v1/completions", json={"prompt": "x", "model": "no-such-model"})
        assert res.status_code == 404, res.text
        # The engine's 422 comes after admission: a request and an item, nothing more.
        res = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 100_000})
        assert res.status_code == 422 and "context length" in res.text, res.text
        tally.requests += 1
        tally.items += 1  # refused before it queued: no queueing delay

        long = {"max_tokens": LONG_TOKENS, "min_tokens": LONG_TOKENS}
        # A runs (streaming); B waits behind it (--max-num-seqs 1); then the two admitted
        # and unfinished fill --max-queue-len 2 and the next two are refused.
        with httpx.Client(base_url=url, timeout=120) as a_client, a_client.stream(
                "POST", "/v1/completions",
                json={"prompt": "Tell me a very long story.", "stream": True, **long}) as a:
            assert a.status_code == 200
            a_lines = a.iter_lines()  # kept: a dropped iterator would close the stream
            assert next(line for line in a_lines if line.startswith("data: "))
            tally.requests += 1
            tally.items += 1
            tally.ttft += 1
            tally.queueing += 1

            b = raw_post(url, "/v1/completions", {"prompt": "Wait your turn.", **fixed})
            tally.requests += 1
            tally.items += 1
            tally.queueing += 1
            wait_for(url, "B waiting", lambda m: m["friendli_current_waiting_items"] == 1)

            for path, body in (("/v1/completions", {"prompt": "hi", **fixed}),
                               ("/v1/chat/completions",
                                {"messages": [{"role": "user", "content": "hi"}], **fixed})):
                res = http.post(path, json=body)
                assert res.status_code == 503 and res.headers["retry-after"], res.text
                assert "saturated" in res.text
                tally.requests += 1
                tally.rejects += 1

            b.close()  # hang up while queued
            tally.cancels += 1
            wait_for(url, "B's cancel", lambda m: m["friendli_failure_by_cancel"] == 1
                     and m["friendli_current_waiting_items"] == 0)
            # leaving the block hangs up on A mid-stream
        tally.cancels += 1
        wait_for(url, "A's cancel", lambda m: m["friendli_failure_by_cancel"] == 2
                 and m["friendli_current_requests"] == 0)

        # C: a non-streaming request hung up on once its tokens are being generated.
        c = raw_post(url, "/v1/completions", {"prompt": "Write a long essay.", **long})
        tally.requests += 1
        tally.items += 1
        tally.ttft += 1
        tally.queueing += 1
        wait_for(url, "C generating", lambda m: m["friendli_current_assigned_items"] == 1
                 and m["friendli_requests_ttft_count"] == tally.ttft)
        c.close()
        tally.cancels += 1
        wait_for(url, "C's cancel", lambda m: m["friendli_failure_by_cancel"] == 3
                 and m["friendli_current_requests"] == 0
                 and m["friendli_current_items"] == 0)
    return tally


def test_counters_equal_what_was_sent(served, workload):
    m = scrape(served.url)
    t = workload
    assert (t.requests, t.cancels, t.rejects, len(t.finished)) == (12, 3, 2, 6)
    assert m["friendli_requests_total"] == t.requests
    assert m["friendli_responses_total"] == len(t.finished)
    assert m["friendli_items_total"] == t.items
    assert m["friendli_failure_by_cancel"] == t.cancels
    assert m["friendli_failure_by_reject"] == t.rejects
    assert m["friendli_failure_by_timeout"] == 0
    assert m["friendli_failure_by_nan_error"] == 0
    # Nothing in flight, nothing held.
    for name in ("friendli_current_requests", "friendli_current_items",
                 "friendli_current_assigned_items", "friendli_current_waiting_items",
                 "amity_kv_blocks_used"):
        assert m[name] == 0, name


def test_histograms_and_summaries_hold_the_finished_requests(served, workload):
    m = scrape(served.url)
    finished = workload.finished
    for name, values in (("friendli_input_lengths", [p for p, _, _ in finished]),
                         ("friendli_output_lengths", [o for _, o, _ in finished])):
        assert m[f"{name}_count"] == len(finished), name
        assert m[f"{name}_sum"] == sum(values), name
        for le in LENGTH_BUCKETS:
            assert m[f'{name}_bucket{{le="{float(le)}"}}'] == sum(v <= le for v in values), (name, le)
        assert m[f'{name}_bucket{{le="+Inf"}}'] == len(finished), name
    ratios = [c / p for p, _, c in finished]
    assert m["friendli_tcache_hit_ratio_count"] == len(finished)
    assert m["friendli_tcache_hit_ratio_sum"] == pytest.approx(sum(ratios))
    assert m["friendli_tcache_hit_ratio_sum"] > 0
    assert m['friendli_tcache_hit_ratio_bucket{le="0.0"}'] == sum(r == 0 for r in ratios)

    # Latency: the finished only. TTFT: every request that got a token (the finished,
    # the stream and the non-streaming request hung up on mid-generation; not the one
    # hung up on while queued). Queueing: every request admitted to the engine.
    assert m["friendli_requests_latencies_count"] == len(finished)
    assert m["friendli_requests_ttft_count"] == workload.ttft == len(finished) + 2
    assert m["friendli_requests_queueing_delays_count"] == workload.queueing
    # Every request that queued, B (hung up on while waiting) included; not the
    # rejects, nor the 422 the engine refused before queueing it.
    assert workload.queueing == workload.requests - workload.rejects - 1
    for name in ("friendli_requests_latencies", "friendli_requests_ttft"):
        assert m[f"{name}_sum"] > 0, name
        quantiles = [m[f'{name}{{quantile="{q}"}}'] for q in ("0.5", "0.9", "0.95", "0.99")]
        assert quantiles == sorted(quantiles) and quantiles[0] > 0, (name, quantiles)


def test_metrics_port_serves_the_same_metrics(served, workload):
    """`--metrics-port` (Friendli Container's 8281) serves /metrics on a port of its
    own, the same registry as the main port's /metrics, which stays too."""
    main = httpx.get(f"{served.url}/metrics", timeout=10)
    side = httpx.get(f"{served.metrics_url}/metrics", timeout=10)
    for res in (main, side):
        assert res.status_code == 200
        assert res.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert parse(side.text) == parse(main.text)
    assert parse(side.text)["friendli_requests_total"] == workload.requests
    # Only the metrics live there, not the API.
    assert httpx.get(f"{served.metrics_url}/v1/models", timeout=10).status_code == 404
