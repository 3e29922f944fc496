"""Memory: the server's resident memory (RSS) stays flat under a long, mixed workload.

Issue 6's target: RSS stays within 5% over 2,000 requests.

The script starts `amity serve` (as `python -m amity.cli serve`) on a free port, waits
for `GET /health` to answer 200, and sends, at `--concurrency` (closed loop: each client
sends its next request when its last one ends):

- `--warmup` requests (default 200), then `--num-requests` (default 2,000) more;
- short prompts of varying content and length (3-150 random words), `--max-tokens`
  (default 4) tokens out, temperature 0 or 0.8 (seeded);
- a mix, drawn per request with `--seed`: `/v1/completions` and `/v1/chat/completions`,
  each streamed and not (21% each), streams the client drops after the first chunk
  (8%; asked for 4 x max tokens, so the server is mid-stream) and non-streamed requests
  the client gives up on after 0.3 s (8%, same length).

RSS (VmRSS in /proc/PID/status, summed over the server and any child processes) is
read after the warm-up (the baseline) and after every `--sample-every` requests, each
time once the requests in flight have ended and a second has passed. Growth is
measured against the baseline; the target is met if no sample is more than 5% above
(or below) it. The server is stopped with SIGTERM.

It prints one JSON line (the samples, baseline, end, max, growth, the outcome of every
request, warm-up included, and the server's own request and cancel counters from
/metrics) and a Markdown table. It exits 1 if a request that should have succeeded
did not.

    .venv/bin/python benchmarks/memory_flat.py --num-threads 2
    .venv/bin/python benchmarks/memory_flat.py --num-requests 2000 --concurrency 8 \\
        --max-tokens 8 --dtype float32 --num-threads 2
"""

import argparse
import asyncio
import collections
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

from served import add_server_arguments, engine_line, server_flags, start_server, stop_server

TARGET_PCT = 5.0
ABANDON_AFTER_S = 0.3
EARLY = "ok (finished before the client gave up)"
KINDS = {  # kind: weight
    "completion": 21, "completion_stream": 21, "chat": 21, "chat_stream": 21,
    "stream_dropped": 8, "abandoned": 8,
}
WORDS = ("time year people way day man thing woman life child world school state family "
         "student group country problem hand part place case week company system program "
         "question work government number night point home water room mother area money "
         "story fact month lot right study book eye job word business issue side kind head "
         "house service friend father power hour game line end member law car city name "
         "zebra quartz xylophone jubilant vortex 42 7 1999 ? ! ; , é ü 東京 🙂").split()


# ---------------------------------------------------------------- resident memory

def rss_bytes(pid: int) -> int:
    """VmRSS of `pid` plus that of its descendants (amity serves from one process, but a
    child would count)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # it ended meanwhile
        total += parse_vm_kib(status, "VmRSS") * 1024
    return total


def parse_vm_kib(status: str, field: str) -> int:
    """`VmRSS:   123456 kB` -> 123456 (kB in /proc is KiB)."""
    for line in status.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise ValueError(f"no {field} in /proc status")


def summarize(samples: list[dict], target_pct: float = TARGET_PCT) -> dict:
    """`samples`: [{"requests": n, "rss_bytes": b, ...}], the first taken after the
    warm-up. Growth is relative to that first sample."""
    base = samples[0]["rss_bytes"]
    rss = [s["rss_bytes"] for s in samples]
    worst = max(rss, key=lambda b: abs(b - base))
    mib = 2 ** 20
    return {
        "rss_after_warmup_mib": round(base / mib, 1),
        "rss_end_mib": round(rss[-1] / mib, 1),
        "rss_max_mib": round(max(rss) / mib, 1),
        "growth_end_mib": round((rss[-1] - base) / mib, 1),
        "growth_end_pct": round(100 * (rss[-1] - base) / base, 2),
        "growth_max_pct": round(100 * (max(rss) - base) / base, 2),
        "target_pct": target_pct,
        "target_met": abs(worst - base) <= base * target_pct / 100,
    }


def server_counters(url: str) -> dict:
    """The server's own request counters from GET /metrics: requests received, answered
    in full, abandoned by the client (the dropped streams and given-up requests)."""
    names = ("friendli_requests_total", "friendli_responses_total",
             "friendli_failure_by_cancel", "friendli_failure_by_reject")
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {name: float(line.split()[-1]) for line in text.splitlines()
            for name in names if line.startswith(name + " ")}


# ---------------------------------------------------------------- the workload

def make_request(rng: random.Random, max_tokens: int) -> tuple[str, str, dict]:
    """(kind, path, body) of one request; the content and length of the prompt vary."""
    kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 150)))
    body = {"max_tokens": max_tokens, "temperature": rng.choice((0, 0.8)),
            "seed": rng.randrange(2**31)}
    if kind in ("stream_dropped", "abandoned"):
        body["max_tokens"] = body["min_tokens"] = 4 * max_tokens
    chat = kind.startswith("chat") or (kind in ("stream_dropped", "abandoned") and rng.random() < 0.5)
    if chat:
        messages = [{"role": "user", "content": text}]
        if rng.random() < 0.5:
            messages.insert(0, {"role": "system", "content": "Answer in one short sentence."})
        body["messages"] = messages
        path = "/v1/chat/completions"
    else:
        body["prompt"] = text
        path = "/v1/completions"
    if kind.endswith("stream") or kind == "stream_dropped":
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return kind, path, body


async def send(client: httpx.AsyncClient, kind: str, path: str, body: dict) -> str:
    """One request; returns its outcome: `ok`, `dropped`, `abandoned`, or what went wrong."""
    try:
        if kind == "abandoned":
            try:
                res = await client.post(path, json=body,
                                        timeout=httpx.Timeout(60, read=ABANDON_AFTER_S))
            except httpx.ReadTimeout:
                return "abandoned"
            return EARLY if res.status_code == 200 else f"HTTP {res.status_code}"
        if not body.get("stream"):
            res = await client.post(path, json=body)
            if res.status_code != 200:
                return f"HTTP {res.status_code}: {res.text[:200]}"
            return "ok" if res.json()["choices"] else "no choices"
        async with client.stream("POST", path, json=body) as res:
            if res.status_code != 200:
                return f"HTTP {res.status_code}: {(await res.aread())[:200]!r}"
            async for line in res.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if kind == "stream_dropped":
                    return "dropped"  # leaving the block closes the connection mid-stream
                if line == "data: [DONE]":
                    return "ok"
            return "stream ended without [DONE]"
    except httpx.HTTPError as error:
        return f"{type(error).__name__}: {error}"


async def run_block(client, rng, n: int, concurrency: int, max_tokens: int,
                    outcomes: collections.Counter) -> None:
    """`n` requests, `concurrency` at a time, until all have ended."""
    requests = iter([make_request(rng, max_tokens) for _ in range(n)])

    async def client_loop():
        for kind, path, body in requests:  # one shared iterator: each request sent once
            outcomes[(kind, await send(client, kind, path, body))] += 1

    await asyncio.gather(*(client_loop() for _ in range(concurrency)))


async def run(url: str, pid: int, args) -> tuple[list[dict], collections.Counter, float]:
    """The warm-up, then the measured blocks with a sample after each; also returns the
    seconds spent sending the measured requests (the pauses before samples left out)."""
    rng = random.Random(args.seed)
    outcomes: collections.Counter = collections.Counter()
    samples: list[dict] = []
    limits = httpx.Limits(max_connections=2 * args.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        await run_block(client, rng, args.warmup, args.concurrency, args.max_tokens, outcomes)
        start, done, load_s = time.perf_counter(), 0, 0.0
        while True:
            await asyncio.sleep(1.0)  # let the server finish cleaning up after the block
            samples.append({"requests": done, "elapsed_s": round(time.perf_counter() - start, 1),
                            "rss_bytes": rss_bytes(pid)})
            print(f"{done:5d} requests  {samples[-1]['elapsed_s']:7.1f} s  "
                  f"RSS {samples[-1]['rss_bytes'] / 2**20:8.1f} MiB", file=sys.stderr, flush=True)
            if done >= args.num_requests:
                break
            n = min(args.sample_every, args.num_requests - done)
            t0 = time.perf_counter()
            await run_block(client, rng, n, args.concurrency, args.max_tokens, outcomes)
            load_s += time.perf_counter() - t0
            done += n
    return samples, outcomes, load_s


def table(result: dict) -> str:
    base = result["samples"][0]["rss_bytes"]
    rows = ["| requests after warm-up | elapsed s | RSS MiB | vs warm-up |", "|---|---|---|---|"]
    for s in result["samples"]:
        rows.append(f"| {s['requests']} | {s['elapsed_s']:.1f} | {s['rss_bytes'] / 2**20:.1f} "
                    f"| {100 * (s['rss_bytes'] - base) / base:+.2f}% |")
    m = result["summary"]
    rows.append("")
    rows.append(f"RSS after warm-up {m['rss_after_warmup_mib']} MiB, end {m['rss_end_mib']} MiB "
                f"({m['growth_end_mib']:+.1f} MiB, {m['growth_end_pct']:+.2f}%), "
                f"max {m['rss_max_mib']} MiB "
                f"({m['growth_max_pct']:+.2f}%); target within {TARGET_PCT:g}%: "
                f"{'met' if m['target_met'] else 'NOT met'}")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-requests", type=int, default=2000, help="measured, after the warm-up")
    parser.add_argument("--warmup", type=int, default=200, help="requests before the baseline")
    parser.add_argument("--sample-every", type=int, default=200, help="requests between RSS samples")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=4, help="tokens out per request")
    parser.add_argument("--seed", type=int, default=0, help="seeds the request mix and prompts")
    add_server_arguments(parser)
    args = parser.parse_args()
    server_args = server_flags(args)
    log_path = Path(tempfile.mkdtemp(prefix="amity-memory-")) / "server.log"
    began = time.perf_counter()
    proc, url = start_server(server_args, log_path)
    try:
        samples, outcomes, load_s = asyncio.run(run(url, proc.pid, args))
        peak_kib = parse_vm_kib(Path(f"/proc/{proc.pid}/status").read_text(), "VmHWM")
        counters = server_counters(url)
    finally:
        exit_code = stop_server(proc)

    expected = {"ok", "dropped", "abandoned", EARLY}
    failures = {f"{k} -> {o}": n for (k, o), n in outcomes.items() if o not in expected}
    result = {"benchmark": "memory_flat", "num_requests": args.num_requests,
              "warmup": args.warmup, "concurrency": args.concurrency,
              "max_tokens": args.max_tokens, "seed": args.seed,
              "server_args": server_args, "engine": engine_line(log_path),
              "server_exit_code": exit_code, "wall_s": round(time.perf_counter() - began, 1),
              "load_s": round(load_s, 1),
              "requests_per_s": round(args.num_requests / load_s, 2) if load_s else None,
              "summary": summarize(samples),
              "peak_rss_vmhwm_mib": round(peak_kib / 1024, 1),
              "outcomes": {f"{k}: {o}": n for (k, o), n in sorted(outcomes.items())},
              "server_counters": counters, "failures": failures, "samples": samples}
    print(json.dumps(result))
    print()
    print(table(result))
    if failures:
        print(f"error: requests failed: {failures}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
