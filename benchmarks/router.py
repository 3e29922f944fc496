"""The Suite router's cost, and the cold start of a sleeping endpoint.

Starts `amity suite` (no default container) on a fresh data directory, creates a
dedicated endpoint of MODEL, and streams the same completions (fixed prompt, fixed
length: `min_tokens` = `max_tokens`) at each concurrency, directly to the endpoint's
replica and through `/dedicated/v1/completions`, in interleaved rounds (direct then
routed, then routed then direct, ...: a drift of the machine's load hits both alike).
Reports the medians over rounds of tokens/s, of the median TTFT and of the Suite
process's CPU time per request (user + system: what the router takes from the replica
on a small machine, and what the load of other processes does not blur), with the
load average, then sleeps the endpoint and times a request from SLEEPING to its first
token.

    .venv/bin/python benchmarks/router.py --concurrency 1,32 --requests 32 --output-len 64 --rounds 3
"""

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from amity.bench.serve import post_lines
from served import cpu_seconds, free_port  # this folder's helpers
from amity.http_client import HttpClient

TOKEN = "amity_bench_token"
REPO = Path(__file__).resolve().parents[1]
PYTHONPATH = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))




async def one(client: HttpClient, url: str, body: bytes, headers: list) -> tuple[float, int, float]:
    """(TTFT s, tokens, seconds) of one streamed completion."""
    start = time.perf_counter()
    first, tokens = None, 0

    def on_line(line: bytes) -> None:  # token chunks: one `data:` line each, counted as read
        nonlocal first, tokens
        if line.startswith(b"data: {") and b'"token"' in line:
            first = first or time.perf_counter()
            tokens += 1

    status, text = await post_lines(client, url, headers, body, on_line)
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {text[:200]!r}")
    return first - start, tokens, time.perf_counter() - start


async def level(url: str, body: dict, headers: dict, concurrency: int, requests: int) -> dict:
    """`url`'s streams on amity's lean HTTP/1.1 client (amity/http_client.py, the load
    generator's): on 2 cores its CPU per chunk is taken from the replica and the Suite."""
    queue = list(range(requests))
    results = []
    client = HttpClient()
    raw_headers = [(b"content-type", b"application/json"),
                   *((k.lower().encode(), v.encode()) for k, v in headers.items())]
    payload = json.dumps(body).encode()

    async def worker():
        while queue:
            queue.pop()
            results.append(await one(client, url, payload, raw_headers))
    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.aclose()
    elapsed = time.perf_counter() - started
    ttfts_ms = sorted(1000 * r[0] for r in results)
    return {"tokens_per_s": sum(r[1] for r in results) / elapsed,
            "ttft_ms_median": statistics.median(ttfts_ms),
            # the spread: whether a wave's requests start in one engine step or several
            "ttft_ms_min_max": [ttfts_ms[0], ttfts_ms[-1]]}




def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--requests", type=int, default=64,
                        help="requests per level (at least the level's concurrency)")
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per level")
    parser.add_argument("--replica-args", default="--kv-cache-memory 256MiB")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="amity-router-bench-"))
    port = free_port()
    suite = subprocess.Popen(
        [sys.executable, "-m", "amity.cli", "suite", "--port", str(port), "--data-dir", str(data),
         "--container-model", "none", "--replica-args", args.replica_args],
        env={**os.environ, "AMITY_ADMIN_TOKEN": TOKEN, "PYTHONPATH": PYTHONPATH},
        stdout=open(data / "suite.log", "w"), stderr=subprocess.STDOUT)  # noqa: SIM115
    base, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {TOKEN}"}
    http = httpx.Client(base_url=base, headers=headers, timeout=600, trust_env=False)
    try:
        while True:
            try:
                if http.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        listing = json.loads(subprocess.run(
            [sys.executable, "-m", "amity.cli", "admin", "list", "--json", "--data-dir", str(data)],
            capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": PYTHONPATH}).stdout)
        endpoint = http.post("/dedicated/beta/endpoint", json={
            "projectId": listing["projects"][0]["id"], "name": "bench", "instanceOptionId": "cpu",
            "hfModelRepo": args.model, "autoscalingPolicy": {"minReplica": 0, "maxReplica": 1,
                                                             "cooldownPeriod": 3600},
            "advanced": {"tokenizer_skip_special_tokens": True,
                         "tokenizer_add_special_tokens": False}}).json()["id"]
        while http.get(f"/dedicated/beta/endpoint/{endpoint}/status").json()["status"] != "RUNNING":
            time.sleep(0.5)
        log = next((data / "replicas").glob("*.log")).read_text().splitlines()[0]
        replica_port = re.search(r"--port (\d+)", log).group(1)
        direct = f"http://127.0.0.1:{replica_port}/v1/completions"
        body = {"model": endpoint, "prompt": "Once upon a time, in a land far away,",
                "max_tokens": args.output_len, "min_tokens": args.output_len, "stream": True}
        asyncio.run(level(direct, body, {}, 1, 2))  # warm-up
        print(json.dumps({"suite_pid": suite.pid, "replica_port": int(replica_port)}), flush=True)
        routed_url = base + "/dedicated/v1/completions"
        for c in [int(x) for x in args.concurrency.split(",")]:
            requests = max(args.requests, c)
            load_before = os.getloadavg()[0]
            runs = {"direct": [], "router": []}
            for round_index in range(args.rounds):
                order = [("direct", direct, {}), ("router", routed_url, headers)]
                for name, url, extra in order[::-1] if round_index % 2 else order:
                    suite_cpu_before = cpu_seconds(suite.pid)
                    runs[name].append(asyncio.run(level(url, body, extra, c, requests)))
                    runs[name][-1]["suite_cpu_ms_per_request"] = (
                        1000 * (cpu_seconds(suite.pid) - suite_cpu_before) / requests)
            mine, routed = (
                {key: statistics.median(r[key] for r in runs[name])
                 for key in ("tokens_per_s", "ttft_ms_median", "suite_cpu_ms_per_request")}
                for name in ("direct", "router"))
            print(json.dumps({"concurrency": c, "rounds": args.rounds, "direct": mine, "router": routed,
                              "throughput_cost_pct": 100 * (1 - routed["tokens_per_s"] / mine["tokens_per_s"]),
                              "ttft_added_ms": routed["ttft_ms_median"] - mine["ttft_ms_median"],
                              "load_average_1min": [load_before, os.getloadavg()[0]],
                              "per_round": runs}),
                  flush=True)
        http.put(f"/dedicated/beta/endpoint/{endpoint}/sleep")
        while http.get(f"/dedicated/beta/endpoint/{endpoint}").json()["currReplicaCnt"]:
            time.sleep(0.2)
        cold = asyncio.run(level(base + "/dedicated/v1/completions", body, headers, 1, 1))
        ttft = cold["ttft_ms_median"] / 1000
        print(json.dumps({"cold_start_from_sleeping_s": ttft}), flush=True)
    finally:
        suite.terminate()
        suite.wait(timeout=60)


if __name__ == "__main__":
    main()
