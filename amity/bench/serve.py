"""`amity bench serve`: a load generator for any server with streaming `/v1/completions`.

Works against amity, llama.cpp's server and vLLM alike, so their figures are comparable:
- prompts are exactly `input_len` tokens by the server's own tokenizer (its tokenize
  endpoint), sent as token ids where the server takes them, as text otherwise;
- output length is fixed (`min_tokens` = `max_tokens`, plus `ignore_eos`), and every
  request's completion count is checked against the server's `usage`: a short or
  unverifiable answer is a failure, reported with its reason, never averaged in;
- every concurrency level gets fresh prompts, so a prefix cache cannot serve a level
  from the previous one.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from amity.http_client import HttpClient

# A-Z common English words: nearly every one is a single token after a space, so a
# prompt of N of them is close to N tokens before it is fitted exactly.
WORDS = ("about above across after again against air all also always animal answer any area "
         "around ask away back base be before began being below best better between big black "
         "blue boat body book both boy bring build but call came can car carry case change "
         "city class clear close cold come common could country course cut dark day deep did "
         "differ direction do does dog door down draw during each early earth east eat end "
         "enough even ever every eye face fact fall family far farm fast father feel field "
         "find fire first fish five follow food foot form found four free friend from front "
         "full game gave get girl give go gold good great green ground group grow had half "
         "hand hard has have head hear heard help here high hold home horse hot house how "
         "idea inch into island just keep kind king know land large last late lead learn "
         "leave left letter life light line list little live long look low made main make "
         "man many map mark may mean men might mile mind miss money moon more morning most "
         "mother mountain move much music must name near need never new next night north "
         "note now number object ocean off often old once only open order other our out over "
         "page paper part pass people perhaps picture piece place plain plan plant play point "
         "port power press pull put question quick rain ran reach read ready real red remember "
         "rest river road rock room round rule run said same saw say school sea second see "
         "seem self sentence serve set several shape ship short should show side simple since "
         "sing sit six size sleep slow small snow some song soon sound south space special "
         "spell stand star start state stay step still stone stood stop story street strong "
         "study such sun sure surface table tail take talk tell ten test than that their them "
         "then there these thing think three through time together told too took top toward "
         "town tree true try turn two under unit until upon use very voice wait walk want warm "
         "watch water way week weight well went west what wheel when where while white whole "
         "why wind window winter wish with wonder wood word work world write year young").split()


@dataclass
class Workload:
    concurrency: list[int] | None = None  # None: [1, 8, 32], or one uncapped level with a rate
    request_rate: float | None = None     # Poisson arrivals per second; None: closed loop
    num_prompts: int | None = None        # per level; None: max(8, 4 x concurrency)
    input_len: int = 128
    output_len: int = 128
    seed: int = 0
    model: str | None = None              # None: the first of the server's /v1/models

    def levels(self) -> list[int | None]:
        if self.concurrency:
            return list(self.concurrency)
        return [None] if self.request_rate else [1, 8, 32]

    def prompts_for(self, concurrency: int | None) -> int:
        if self.num_prompts:
            return self.num_prompts
        return max(8, 4 * (concurrency or 8))


@dataclass
class Target:
    """What the load generator learned about a server before loading it."""

    url: str
    model: str | None
    tokenize_path: str | None  # None: the server has no tokenize endpoint we know
    sends_tokens: bool         # True: it takes `tokens` (amity's token-id prompt field)


@dataclass
class RequestRecord:
    concurrency: int | None
    start_s: float                   # when it was sent, from the start of its level
    ok: bool = False
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


# ------------------------------------------------------------------ finding out the server

def _tokens_of(reply: dict) -> list[int] | None:
    tokens = reply.get("tokens") if isinstance(reply, dict) else None
    if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
        return tokens
    return None


async def _tokenize(client, target: Target, text: str) -> list[int]:
    # One body for every dialect: amity and vLLM read `prompt`, llama-server `content`,
    # llama-cpp-python `input`; each ignores the others' fields.
    body = {"prompt": text, "content": text, "input": text}
    if target.model:
        body["model"] = target.model
    reply = await client.post(target.url + target.tokenize_path, json=body)
    reply.raise_for_status()
    tokens = _tokens_of(reply.json())
    if tokens is None:
        raise ValueError(f"{target.tokenize_path} answered without a token list")
    return tokens


async def discover(client, url: str, model: str | None) -> Target:
    url = url.rstrip("/")
    if model is None:
        try:
            reply = await client.get(url + "/v1/models")
            if reply.status_code == 200 and reply.json().get("data"):
                model = reply.json()["data"][0]["id"]
        except Exception:  # noqa: BLE001 - a server without /v1/models is still usable
            pass
    target = Target(url, model, None, False)
    for path in ("/v1/tokenize", "/tokenize", "/extras/tokenize"):
        target.tokenize_path = path
        try:
            if await _tokenize(client, target, "hello world"):
                break
        except Exception:  # noqa: BLE001 - not this dialect; try the next
            pass
    else:
        target.tokenize_path = None
    if target.tokenize_path:
        # Only a server that answers a `tokens` prompt with the same prompt length takes it;
        # others reject it (no `prompt`) or would silently generate from nothing.
        ids = await _tokenize(client, target, "the quick brown fox jumps")
        body = {"tokens": ids, "max_tokens": 1, **({"model": model} if model else {})}
        try:
            reply = await client.post(url + "/v1/completions", json=body)
            usage = (reply.json().get("usage") or {}) if reply.status_code == 200 else {}
            target.sends_tokens = usage.get("prompt_tokens") == len(ids)
        except Exception:  # noqa: BLE001
            target.sends_tokens = False
    return target


# ------------------------------------------------------------------ prompts

async def _fit_text(client, target: Target, words: list[str], length: int) -> str:
    """Text that the server tokenizes to exactly `length` tokens: the shortest prefix of
    `words` that reaches it, its last word swapped if it overshoots."""
    async def count(k: int, last: str | None = None) -> int:
        chosen = words[:k] if last is None else words[:k - 1] + [last]
        return len(await _tokenize(client, target, " ".join(chosen)))

    while await count(len(words)) < length:
        words = words + words
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi) // 2
        if await count(mid) < length:
            lo = mid + 1
        else:
            hi = mid
    if await count(lo) != length:
        for last in WORDS[:40]:
            if await count(lo, last) == length:
                return " ".join(words[:lo - 1] + [last])
    return " ".join(words[:lo])  # the closest there is; usage.prompt_tokens tells the truth


async def build_prompts(client, target: Target, n: int, length: int,
                        rng: random.Random) -> list[list[int] | str]:
    word_lists = [[rng.choice(WORDS) for _ in range(length)] for _ in range(n)]
    if target.tokenize_path is None:
        return [" ".join(words) for words in word_lists]  # about `length` tokens
    limit = asyncio.Semaphore(8)

    async def one(words: list[str]) -> list[int] | str:
        async with limit:
            if target.sends_tokens:
                ids = await _tokenize(client, target, " ".join(words * 2))
                return ids[:length]
            return await _fit_text(client, target, words, length)

    return list(await asyncio.gather(*(one(w) for w in word_lists)))


# ------------------------------------------------------------------ one request

_JSON = [(b"content-type", b"application/json"), (b"accept", b"*/*")]
REQUEST_TIMEOUT_S = 600.0  # a server that stops answering fails its request, not the run


def request_body(target: Target, prompt: list[int] | str, output_len: int) -> dict:
    body = {
        "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": output_len, "min_tokens": output_len,
        "ignore_eos": True,  # vLLM and llama.cpp honor it; servers that don't, ignore it
        "temperature": 0.0,
    }
    if target.model:
        body["model"] = target.model
    body["tokens" if isinstance(prompt, list) else "prompt"] = prompt
    return body


async def post_lines(client: HttpClient, url: str, headers: list[tuple[bytes, bytes]],
                     body: bytes, on_line: Callable[[bytes], bool | None]) -> tuple[int, bytes]:
    """POST `body` to `url`; `on_line(line)` for each line of a 200's body (no line
    ending) as soon as it is read, until it returns True. Returns the status, and the
    body when the status is not 200."""
    answer = await client.request("POST", url, headers, body)
    try:
        if answer.status != 200:
            return answer.status, await answer.read()
        partial = b""
        async for piece in answer:
            *lines, partial = (partial + piece).split(b"\n")
            for line in lines:
                if on_line(line.removesuffix(b"\r")):
                    return 200, b""  # the rest is not read: closing the answer drops its connection
        return 200, b""
    finally:
        await answer.aclose()


async def send(client: HttpClient, target: Target, body: dict, record: RequestRecord,
               t0: float) -> None:
    """Fill `record` from one streamed request; any doubt about its count fails it."""
    expected = body["max_tokens"]
    sent = time.perf_counter()
    record.start_s = sent - t0
    last = None
    streamed, usage, done = 0, None, False

    def on_line(line: bytes) -> bool | None:  # each line as it is read, timed then
        nonlocal last, streamed, usage, done
        if done or not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            return
        chunk = json.loads(data)
        if chunk.get("error"):
            record.error = f"error chunk: {str(chunk['error'])[:120]}"
            return True  # read no further
        usage = chunk.get("usage") or usage  # vLLM sends `usage: null` on every chunk
        for choice in chunk.get("choices") or []:
            if not choice.get("text") and choice.get("token") is None:
                continue  # e.g. the closing chunk that only carries finish_reason
            now = time.perf_counter()
            if last is None:
                record.ttft_s = now - sent
            else:
                record.itl_s.append(now - last)
            last = now
            streamed += choice.get("token") is not None

    try:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            status, text = await post_lines(client, target.url + "/v1/completions", _JSON,
                                            json.dumps(body).encode(), on_line)
    except Exception as error:  # noqa: BLE001 - a dropped connection is a failed request
        record.error = f"{type(error).__name__}: {error}"[:160]
        return
    if status != 200:
        record.error = f"HTTP {status}: {text.decode(errors='replace')[:120]}"
    if record.error:
        return
    record.e2e_s = time.perf_counter() - sent
    if usage:
        record.prompt_tokens = usage.get("prompt_tokens")
        record.completion_tokens = usage.get("completion_tokens")
    if not done:
        record.error = "stream ended without [DONE]"
    elif usage is None:
        record.error = "no usage chunk (stream_options.include_usage ignored?)"
    elif record.completion_tokens != expected:
        record.error = f"usage says {record.completion_tokens} completion tokens, asked {expected}"
    elif streamed and streamed != record.completion_tokens:
        record.error = f"streamed {streamed} tokens, usage says {record.completion_tokens}"
    elif last is None:
        record.error = "no content chunks"
    else:
        record.ok = True


# ------------------------------------------------------------------ one level

async def run_level(client: HttpClient, target: Target, prompts: list, workload: Workload,
                    concurrency: int | None, rng: random.Random,
                    progress: bool) -> tuple[list[RequestRecord], float]:
    from tqdm import tqdm

    label = f"c={concurrency}" if concurrency else "c=inf"
    if workload.request_rate:
        label += f" rate={workload.request_rate}/s"
    bar = tqdm(total=len(prompts), desc=label, unit="req", disable=not progress, file=sys.stderr)
    records = [RequestRecord(concurrency, 0.0) for _ in prompts]
    bodies = [request_body(target, p, workload.output_len) for p in prompts]
    t0 = time.perf_counter()

    async def one(i: int) -> None:
        await send(client, target, bodies[i], records[i], t0)
        bar.update(1)

    if workload.request_rate is None:
        pending = iter(range(len(prompts)))

        async def worker() -> None:  # closed loop: each worker sends its next when one ends
            for i in pending:
                await one(i)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    else:
        cap = asyncio.Semaphore(concurrency) if concurrency else None

        async def capped(i: int) -> None:
            if cap is None:
                return await one(i)
            async with cap:
                await one(i)

        tasks, due = [], t0
        for i in range(len(prompts)):
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            tasks.append(asyncio.create_task(capped(i)))
            due += rng.expovariate(workload.request_rate)
        await asyncio.gather(*tasks)
    bar.close()
    return records, time.perf_counter() - t0


def _stats_ms(values: list[float]) -> dict:
    import numpy as np

    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    a = np.asarray(values) * 1000.0
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99))}


def summarize(records: list[RequestRecord], duration: float, concurrency: int | None,
              workload: Workload, system: str) -> dict:
    ok = [r for r in records if r.ok]
    out_tokens = sum(r.completion_tokens for r in ok)
    prompt_lens = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    return {
        "system": system, "concurrency": concurrency, "request_rate": workload.request_rate,
        "input_len": workload.input_len, "output_len": workload.output_len,
        "num_prompts": len(records), "completed": len(ok), "failures": len(records) - len(ok),
        "failure_reasons": dict(Counter(r.error for r in records if not r.ok)),
        "duration_s": duration, "output_tokens": out_tokens,
        "output_tok_s": out_tokens / duration, "requests_s": len(ok) / duration,
        "prompt_tokens_mean": sum(prompt_lens) / len(prompt_lens) if prompt_lens else None,
        "ttft_ms": _stats_ms([r.ttft_s for r in ok]),
        "itl_ms": _stats_ms([x for r in ok for x in r.itl_s]),
        "e2e_ms": _stats_ms([r.e2e_s for r in ok]),
    }


async def run_benchmark(url: str, workload: Workload, system: str = "server",
                        progress: bool = True) -> tuple[list[dict], list[RequestRecord]]:
    import httpx

    rng = random.Random(workload.seed)
    # httpx finds out the server and fits the prompts; the measured streams go through
    # the lean client. trust_env=False: a proxy from the environment must not sit between us and localhost.
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0), trust_env=False,
                                 limits=httpx.Limits(max_connections=None,
                                                     max_keepalive_connections=None)) as client:
        target = await discover(client, url, workload.model)
        how = ("token ids" if target.sends_tokens else "text") + (
            f", fitted with {target.tokenize_path}" if target.tokenize_path
            else ", about 1 token per word (no tokenize endpoint)")
        print(f"{system}: {target.url} model={target.model} prompts as {how}", file=sys.stderr)
        [warm] = await build_prompts(client, target, 1, workload.input_len, rng)
        streams = HttpClient()
        try:
            warm_up = RequestRecord(None, 0.0)  # not counted
            await send(streams, target, request_body(target, warm, workload.output_len), warm_up,
                       time.perf_counter())
            # A server that streams nothing is not measured; one that streams the wrong count
            # is, so that its failures show in the results.
            if warm_up.ttft_s is None:
                raise RuntimeError(f"{system} at {target.url}: the warm-up request failed: "
                                   f"{warm_up.error}")
            summaries, all_records = [], []
            for c in workload.levels():
                prompts = await build_prompts(client, target, workload.prompts_for(c),
                                              workload.input_len, rng)
                records, duration = await run_level(streams, target, prompts, workload, c, rng,
                                                    progress)
                summaries.append(summarize(records, duration, c, workload, system))
                all_records += records
        finally:
            await streams.aclose()
    return summaries, all_records


# ------------------------------------------------------------------ reporting

def _cell(stats: dict) -> str:
    if stats["mean"] is None:
        return "–"
    return " / ".join(f"{stats[k]:.0f}" if stats[k] >= 10 else f"{stats[k]:.1f}"
                      for k in ("mean", "p50", "p90", "p99"))


def level_label(s: dict) -> str:
    label = str(s["concurrency"]) if s["concurrency"] else "inf"
    return label + (f" @ {s['request_rate']}/s" if s["request_rate"] else "")


def markdown_table(summaries: list[dict]) -> str:
    lines = ["| system | concurrency | ok / sent | out tok/s | req/s "
             "| TTFT ms mean / p50 / p90 / p99 | ITL ms mean / p50 / p90 / p99 "
             "| E2E ms mean / p50 / p90 / p99 |",
             "|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        lines.append(f"| {s['system']} | {level_label(s)} | {s['completed']} / {s['num_prompts']} "
                     f"| {s['output_tok_s']:.1f} | {s['requests_s']:.2f} | {_cell(s['ttft_ms'])} "
                     f"| {_cell(s['itl_ms'])} | {_cell(s['e2e_ms'])} |")
    return "\n".join(lines) + "\n"


def failure_report(summaries: list[dict]) -> str:
    lines = []
    for s in summaries:
        for reason, n in s["failure_reasons"].items():
            lines.append(f"FAILED {n} x {s['system']} c={level_label(s)}: {reason}")
    return "\n".join(lines)


def plot(by_system: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for system, summaries in by_system.items():
        labels = [level_label(s) for s in summaries]
        axes[0].plot(labels, [s["output_tok_s"] for s in summaries], marker="o", label=system)
        for ax, key in ((axes[1], "ttft_ms"), (axes[2], "itl_ms")):
            for q, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
                ax.plot(labels, [s[key][q] for s in summaries], style, marker="o",
                        label=f"{system} {q}")
    axes[0].set(title="output throughput", xlabel="concurrency", ylabel="tokens/s")
    axes[1].set(title="time to first token", xlabel="concurrency", ylabel="ms")
    axes[2].set(title="inter-token latency", xlabel="concurrency", ylabel="ms")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(out: Path, summaries: list[dict], records: list[RequestRecord],
                  by_system: dict[str, list[dict]] | None = None) -> str:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "summary.jsonl", "w") as f:
        f.writelines(json.dumps(s) + "\n" for s in summaries)
    with open(out / "requests.jsonl", "w") as f:
        f.writelines(json.dumps(asdict(r)) + "\n" for r in records)
    table = markdown_table(summaries)
    (out / "table.md").write_text(table)
    if by_system is None:
        by_system = {}
        for s in summaries:
            by_system.setdefault(s["system"], []).append(s)
    plot(by_system, out / "plot.png")
    return table


def workload_from_args(args) -> Workload:
    return Workload(concurrency=args.concurrency, request_rate=args.request_rate,
                    num_prompts=args.num_prompts, input_len=args.input_len,
                    output_len=args.output_len, seed=args.seed, model=args.model)


def main(args) -> int:
    workload = workload_from_args(args)
    try:
        summaries, records = asyncio.run(run_benchmark(args.url, workload, args.system,
                                                       progress=not args.no_progress))
    except RuntimeError as error:
        print(f"amity bench serve: {error}", file=sys.stderr)
        return 2
    out = Path(args.out or time.strftime("benchmarks/results/serve-%Y%m%d-%H%M%S"))
    print(write_results(out, summaries, records))
    failures = failure_report(summaries)
    if failures:
        print(failures, file=sys.stderr)
    print(f"results in {out}/ (summary.jsonl, requests.jsonl, table.md, plot.png)", file=sys.stderr)
    return 1 if failures else 0
