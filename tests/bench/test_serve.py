"""The load generator against the paced server (conftest.py), whose timing we set.

Structure, not speed (timing belongs in benchmarks/): the summary's figures are the
per-request records' own, and no record is faster than the server's schedule allows.
"""

import argparse
import asyncio
import json
import statistics

import pytest

from amity.bench import serve
from amity.bench.cli import add_bench_parser
from tests.bench.conftest import ITL, TTFT, L, M


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    return parser.parse_args(argv)


def run(url: str, **workload) -> list[dict]:
    workload = serve.Workload(input_len=L, output_len=M, **workload)
    summaries, _ = asyncio.run(serve.run_benchmark(url, workload, progress=False))
    return summaries


def test_figures_match_a_server_of_known_timing(start_server, tmp_path):
    paced, url = start_server()
    args = parse(["bench", "serve", "--url", url, "--concurrency", "1,4", "--num-prompts", "4",
                  "--input-len", str(L), "--output-len", str(M), "--out", str(tmp_path),
                  "--no-progress"])
    assert serve.main(args) == 0

    summaries = [json.loads(line) for line in (tmp_path / "summary.jsonl").read_text().splitlines()]
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [s["concurrency"] for s in summaries] == [1, 4]
    for s in summaries:
        c = s["concurrency"]
        assert (s["num_prompts"], s["completed"], s["failures"]) == (4, 4, 0), s["failure_reasons"]
        assert s["output_tokens"] == 4 * M
        assert s["prompt_tokens_mean"] == L
        # The figures are the records' own (structure, not speed: timing is benchmarks').
        mine = [r for r in records if r["concurrency"] == c]
        assert len(mine) == 4 and all(len(r["itl_s"]) == M - 1 for r in mine)
        for r in mine:  # the paced server never sends a token before its schedule
            assert TTFT <= r["ttft_s"] <= r["ttft_s"] + sum(r["itl_s"]) <= r["e2e_s"]
            assert r["e2e_s"] >= TTFT + (M - 1) * ITL
        ttft = [r["ttft_s"] * 1e3 for r in mine]
        assert s["ttft_ms"]["mean"] == pytest.approx(sum(ttft) / 4)
        assert s["ttft_ms"]["p50"] == pytest.approx(statistics.median(ttft))
        itl = [x * 1e3 for r in mine for x in r["itl_s"]]
        assert s["itl_ms"]["mean"] == pytest.approx(sum(itl) / len(itl))
        assert s["e2e_ms"]["mean"] == pytest.approx(sum(r["e2e_s"] for r in mine) / 4 * 1e3)
        for stats in (s["ttft_ms"], s["itl_ms"], s["e2e_ms"]):
            assert stats["p50"] <= stats["p90"] <= stats["p99"]
        assert s["output_tok_s"] == pytest.approx(s["output_tokens"] / s["duration_s"])
        assert s["requests_s"] == pytest.approx(4 / s["duration_s"])
        # A level lasts at least its longest request, and no longer than all in a row.
        assert max(r["e2e_s"] for r in mine) <= s["duration_s"]
    # Closed loop at c=4: never more than 4 in flight, and it did reach 4.
    assert paced.max_in_flight == 4
    # 1 warm-up + 2 levels x 4, every one with the output length pinned and token ids sent.
    assert len(paced.bodies) == 9
    assert all(b["min_tokens"] == b["max_tokens"] == M and len(b["tokens"]) == L
               and b["stream_options"] == {"include_usage": True} for b in paced.bodies)
    assert len({tuple(b["tokens"]) for b in paced.bodies}) == 9  # fresh prompts each time

    assert len(records) == 8 and all(r["ok"] for r in records)
    assert "| server | 4 | 4 / 4 |" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_wrong_usage_count_is_reported_as_failures(start_server, tmp_path):
    _, url = start_server(usage_delta=-1)
    [s] = run(url, concurrency=[2], num_prompts=4)
    assert (s["completed"], s["failures"]) == (0, 4)
    assert s["failure_reasons"] == {f"usage says {M - 1} completion tokens, asked {M}": 4}
    assert s["output_tokens"] == 0
    assert "FAILED 4 x server" in serve.failure_report([s])


def test_peer_without_tokens_field_gets_text_of_exactly_input_len(start_server):
    paced, url = start_server(amity_like=False)
    [s] = run(url, concurrency=[2], num_prompts=4)
    assert (s["completed"], s["failures"]) == (4, 0), s["failure_reasons"]
    assert s["prompt_tokens_mean"] == L
    assert all("tokens" not in b and len(b["prompt"].split()) == L and b["ignore_eos"]
               and b["model"] == "paced" for b in paced.bodies)


def test_poisson_mode_sends_the_requested_number_at_the_rate(start_server):
    rate, n = 40.0, 16
    paced, url = start_server()
    workload = serve.Workload(input_len=L, output_len=M, request_rate=rate, num_prompts=n)
    [s], records = asyncio.run(serve.run_benchmark(url, workload, progress=False))
    assert s["concurrency"] is None
    assert (s["num_prompts"], s["completed"], s["failures"]) == (n, n, 0), s["failure_reasons"]
    assert len(paced.bodies) == n + 1  # and the warm-up
    starts = [r.start_s for r in records]
    # Sent one by one on the schedule's order, not all at once.
    assert starts == sorted(starts) and len(set(starts)) == n
    # Open loop: requests overlap, unlike a closed loop of 1.
    assert paced.max_in_flight > 1


def test_a_stream_cut_into_3_byte_reads_is_read_line_by_line():
    frames = [{"choices": [{"index": 0, "text": f" w{k}", "token": k}]} for k in range(2)]
    frames += [{"choices": [{"index": 0, "text": "", "finish_reason": "length"}]},
               {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}]
    sse = b"".join(b"data: %s\r\n\r\n" % json.dumps(f).encode() for f in frames) + b"data: [DONE]\n\n"
    raw = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
           + b"%x\r\n%s\r\n0\r\n\r\n" % (len(sse), sse))

    async def go():
        async def handle(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            for i in range(0, len(raw), 3):  # chunk sizes, lines and JSON split mid-way
                writer.write(raw[i:i + 3])
                await writer.drain()
                await asyncio.sleep(0.001)
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = serve.HttpClient()
        record = serve.RequestRecord(1, 0.0)
        target = serve.Target(f"http://127.0.0.1:{port}", "m", None, True)
        await serve.send(client, target, {"max_tokens": 2}, record, 0.0)
        await client.aclose()
        server.close()
        return record

    record = asyncio.run(go())
    assert record.ok, record.error
    assert (record.prompt_tokens, record.completion_tokens, len(record.itl_s)) == (3, 2, 1)
