"""Prefix caching: TTFT of a request whose long prefix is cached against one whose is not.

Issue 6's target: with a 1,024-token shared prefix, a warm request's time to first
token is under 20% of a cold one's.

The script starts `amity serve` (as `python -m amity.cli serve`) on a free port, waits
for `GET /health` to answer 200, and then, one request at a time:

- builds `--repeats` different prefixes of exactly `--prefix-len` tokens (random words,
  each starting with its own number, so no two share even their first KV block),
  counted with the server's `POST /v1/tokenize`, and sent as token ids (`tokens`), so
  the prefix is the same ids in every request that shares it;
- per prefix, a cold request (prefix + suffix A: nothing of it can be cached yet) and
  then a warm one (the same prefix + a different suffix B);
- TTFT = from sending the streaming `/v1/completions` request to the first SSE chunk
  that carries a token; `usage.prompt_tokens_details.cached_tokens` (the server's own
  count, from `stream_options.include_usage`) shows the cache hit.

`--warmup` untimed cold + warm pairs go first (default 3: on the 2-core development
machine the first three 1,024-token prefills after start-up took up to 50% longer than
the rest). The server is stopped with SIGTERM. It prints one JSON line (every TTFT,
the medians, the ratio, the cached-token counts) and a Markdown table. It exits 1 if a
warm request was not served from the cache (fewer than `--prefix-len` cached tokens)
or a cold one was.

    .venv/bin/python benchmarks/prefix_cache_ttft.py --dtype float32 --num-threads 2
    .venv/bin/python benchmarks/prefix_cache_ttft.py --prefix-len 1024 --repeats 5 \\
        --kv-cache-memory 512MiB --num-threads 2
"""

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from served import add_server_arguments, engine_line, server_flags, start_server, stop_server

TARGET_RATIO = 0.20
WORDS = ("time year people way day man thing woman life child world school state family "
         "student group country problem hand part place case week company system program "
         "question work government number night point home water room mother area money "
         "story fact month lot right study book eye job word business issue side kind head "
         "house service friend father power hour game line end member law car city name").split()


# ---------------------------------------------------------------- prompts

def tokenize(client: httpx.Client, text: str) -> list[int]:
    res = client.post("/v1/tokenize", json={"prompt": text})
    res.raise_for_status()
    return res.json()["tokens"]


def make_prefix(client: httpx.Client, index: int, length: int, seed: int) -> list[int]:
    """Exactly `length` token ids: random words, led by the prefix's own number."""
    rng = random.Random(f"{seed}-{index}")
    words = [f"Document {index}:"] + [rng.choice(WORDS) for _ in range(length * 2)]
    ids = tokenize(client, " ".join(words))
    assert len(ids) >= length, f"{len(ids)} tokens; make the text longer"
    return ids[:length]


def make_suffix(client: httpx.Client, tag: str) -> list[int]:
    return tokenize(client, f"\nQuestion {tag}: which word comes up most often above? Answer:")


# ---------------------------------------------------------------- one timed request

def timed_request(client: httpx.Client, tokens: list[int], max_tokens: int) -> dict:
    """TTFT (send to first token chunk) and the server's usage, from one streamed request."""
    body = {"tokens": tokens, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    ttft, usage, done = None, None, False
    start = time.perf_counter()
    with client.stream("POST", "/v1/completions", json=body) as res:
        if res.status_code != 200:
            raise SystemExit(f"/v1/completions answered {res.status_code}: {res.read()[:500]!r}")
        for line in res.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if ttft is None and any(c.get("token") is not None or c.get("text")
                                    for c in chunk["choices"]):
                ttft = time.perf_counter() - start
            usage = chunk.get("usage") or usage
    e2e = time.perf_counter() - start
    assert done and ttft is not None and usage is not None, "incomplete stream"
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"ttft_ms": ttft * 1e3, "e2e_ms": e2e * 1e3, "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": cached}


# ---------------------------------------------------------------- figures

def summarize(cold: list[dict], warm: list[dict], prefix_len: int) -> dict:
    """Medians, the warm/cold ratio and whether every request hit (or missed) the cache
    as it should."""
    cold_ms = statistics.median(r["ttft_ms"] for r in cold)
    warm_ms = statistics.median(r["ttft_ms"] for r in warm)
    ratio = warm_ms / cold_ms
    return {
        "cold_ttft_ms_median": round(cold_ms, 1),
        "warm_ttft_ms_median": round(warm_ms, 1),
        "warm_over_cold": round(ratio, 4),
        "target_ratio": TARGET_RATIO,
        "target_met": ratio < TARGET_RATIO,
        "cache_hits_as_expected": (all(r["cached_tokens"] >= prefix_len for r in warm)
                                   and all(r["cached_tokens"] == 0 for r in cold)),
    }


def table(result: dict) -> str:
    rows = ["| requests | n | prompt tokens | cached tokens | TTFT p50 ms | TTFT min-max ms |",
            "|---|---|---|---|---|---|"]
    for kind in ("cold", "warm"):
        reqs = result[kind]
        ttfts = [r["ttft_ms"] for r in reqs]
        prompt = sorted({r["prompt_tokens"] for r in reqs})
        cached = sorted({r["cached_tokens"] for r in reqs})
        rows.append(f"| {kind} | {len(reqs)} | {', '.join(map(str, prompt))} "
                    f"| {', '.join(map(str, cached))} | {statistics.median(ttfts):.1f} "
                    f"| {min(ttfts):.1f}-{max(ttfts):.1f} |")
    s = result["summary"]
    rows.append("")
    rows.append(f"warm / cold TTFT: {s['warm_over_cold']:.3f} (target < {TARGET_RATIO}: "
                f"{'met' if s['target_met'] else 'NOT met'})")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prefix-len", type=int, default=1024, help="shared prefix, tokens")
    parser.add_argument("--repeats", type=int, default=5, help="cold + warm pairs timed")
    parser.add_argument("--max-tokens", type=int, default=1, help="tokens generated per request")
    parser.add_argument("--warmup", type=int, default=3, help="untimed cold + warm pairs first")
    parser.add_argument("--seed", type=int, default=0, help="seeds the prefixes' words")
    add_server_arguments(parser)
    args = parser.parse_args()
    server_args = server_flags(args)
    log_path = Path(tempfile.mkdtemp(prefix="amity-prefix-")) / "server.log"
    began = time.perf_counter()
    proc, url = start_server(server_args, log_path)
    try:
        with httpx.Client(base_url=url, timeout=600) as client:
            suffix_a, suffix_b = make_suffix(client, "A"), make_suffix(client, "B")
            for i in range(args.warmup):  # untimed: the first long prefills run slower
                warmup = make_prefix(client, -1 - i, args.prefix_len, args.seed)
                timed_request(client, warmup + suffix_a, args.max_tokens)
                timed_request(client, warmup + suffix_b, args.max_tokens)
            cold, warm = [], []
            for i in range(args.repeats):
                prefix = make_prefix(client, i, args.prefix_len, args.seed)
                cold.append(timed_request(client, prefix + suffix_a, args.max_tokens))
                warm.append(timed_request(client, prefix + suffix_b, args.max_tokens))
    finally:
        exit_code = stop_server(proc)

    result = {"benchmark": "prefix_cache_ttft", "prefix_len": args.prefix_len,
              "repeats": args.repeats, "warmup": args.warmup, "max_tokens": args.max_tokens,
              "server_args": server_args, "engine": engine_line(log_path),
              "server_exit_code": exit_code,
              "wall_s": round(time.perf_counter() - began, 1),
              "summary": summarize(cold, warm, args.prefix_len),
              "cold": [{k: round(v, 1) for k, v in r.items()} for r in cold],
              "warm": [{k: round(v, 1) for k, v in r.items()} for r in warm]}
    print(json.dumps(result))
    print()
    print(table(result))
    if not result["summary"]["cache_hits_as_expected"]:
        print("error: a warm request missed the prefix cache, or a cold one hit it",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
