"""Served against offline throughput of the same engine configuration (issue 14).

Offline: an `LLMEngine` in this process, driven directly (`generate`), `--concurrency`
prompts at a time. Served: `amity serve` with the same flags in its own process, loaded
by `amity bench serve`'s closed loop at the same concurrency (streaming
`/v1/completions`). Both get fresh prompts of exactly `--input-len` tokens every round,
`--output-len` tokens out, and the same number of requests (`--waves` x concurrency);
the two alternate (offline, served, offline, ...) for `--rounds` rounds, so a drift of a
shared machine lands on both, and the served/offline ratio is the median of the rounds'
own ratios. The issue's bar: served within 10% of offline (ratio >= 0.90).

Each round also says where the CPU went, in cores busy over the round: the offline
engine's; during the served round, the server's event loop (its main thread), the rest
of the server (the engine thread, OpenMP workers, the tokenizer pool), and the load
generator (this script's thread). On a 2-core machine the last two are what the served
side pays that the offline side does not.

`--profile FILE` records the server with py-spy (`--py-spy`, not a dependency of the
project) during the last served round: only the thread that holds the GIL is sampled
(`--gil`), per thread, in py-spy's collapsed format, and a summary of where the GIL went
is printed (share of samples per thread and the busiest functions of each).

    .venv/bin/python benchmarks/served_vs_offline.py --rounds 3 --profile /tmp/served.txt
"""

import argparse
import asyncio
import json
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from amity.omp_wait_policy import apply_omp_wait_policy

sys.path.insert(0, str(Path(__file__).resolve().parent))
import served  # this folder's helpers, importable once the line above ran
from served import cpu_seconds
from offline_throughput import greedy_tokens_per_s


def fresh_prompts(tokenizer, rng: random.Random, n: int, length: int) -> list[list[int]]:
    from amity.bench.serve import WORDS

    return [tokenizer.encode(" ".join(rng.choice(WORDS) for _ in range(2 * length)))[:length]
            for _ in range(n)]


def gil_summary(collapsed: Path, top: int = 8) -> dict:
    """py-spy's collapsed stacks (`thread (name) ...;frame;frame count`) per thread: the
    share of GIL samples and the functions (innermost frames) that took most of them."""
    per_thread: Counter = Counter()
    per_function: dict[str, Counter] = {}
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        thread = frames[0]
        per_thread[thread] += int(count)
        per_function.setdefault(thread, Counter())[frames[-1]] += int(count)
    total = sum(per_thread.values()) or 1
    return {"samples": total, "threads": {
        thread: {"share": round(n / total, 3),
                 "top": [(f, round(c / total, 3)) for f, c in per_function[thread].most_common(top)]}
        for thread, n in per_thread.most_common()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    served.add_server_arguments(parser)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--waves", type=int, default=2, help="requests per round = waves x concurrency")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", type=Path, default=None, help="py-spy output (collapsed stacks)")
    parser.add_argument("--py-spy", default="py-spy")
    args = parser.parse_args()

    from amity.config import EngineConfig  # imports no torch

    apply_omp_wait_policy(EngineConfig().omp_wait_policy)  # as `amity serve` sets it, before torch
    from amity.bench import serve
    from amity.engine.llm_engine import LLMEngine

    config = {name: getattr(args, name) for name in served.SERVER_FLAGS if getattr(args, name) is not None}
    if "num_threads" in config:
        config["num_threads"] = int(config["num_threads"])
    engine = LLMEngine(EngineConfig(**config))
    rng = random.Random(args.seed)
    greedy_tokens_per_s(engine, fresh_prompts(engine.tokenizer, rng, 2, args.input_len), 4, 2)  # warm-up
    log = Path(f"/tmp/served_vs_offline-{time.strftime('%H%M%S')}.log")
    proc, url = served.start_server(served.server_flags(args), log)
    num_prompts = args.waves * args.concurrency
    workload = serve.Workload(concurrency=[args.concurrency], num_prompts=num_prompts,
                              input_len=args.input_len, output_len=args.output_len)
    rows = []
    try:
        for round_number in range(1, args.rounds + 1):
            prompts = fresh_prompts(engine.tokenizer, rng, num_prompts, args.input_len)
            offline_cpu, offline_wall = time.process_time(), time.perf_counter()
            offline = greedy_tokens_per_s(engine, prompts, args.output_len, args.concurrency)
            offline_cores = (time.process_time() - offline_cpu) / (time.perf_counter() - offline_wall)
            workload.seed = args.seed + round_number  # fresh prompts for the server too
            spy = None
            if args.profile and round_number == args.rounds:
                spy = subprocess.Popen([args.py_spy, "record", "--pid", str(proc.pid), "--gil", "--threads",
                                        "--nonblocking", "--rate", "200", "--format", "raw",
                                        "--output", str(args.profile)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)  # attached before the load starts
            server_cpu, loop_cpu = cpu_seconds(proc.pid), cpu_seconds(proc.pid, proc.pid)
            client_cpu, served_wall = time.thread_time(), time.perf_counter()
            [summary], _ = asyncio.run(serve.run_benchmark(url, workload, "amity", progress=False))
            served_wall = time.perf_counter() - served_wall
            # CPU as cores busy over the served round: the server's event loop (its main
            # thread), the rest of the server (engine thread, OpenMP workers, tokenizer
            # pool), and the load generator (this thread).
            loop_cores = (cpu_seconds(proc.pid, proc.pid) - loop_cpu) / served_wall
            server_cores = (cpu_seconds(proc.pid) - server_cpu) / served_wall
            client_cores = (time.thread_time() - client_cpu) / served_wall
            if spy:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=60)
            if summary["failures"]:
                raise SystemExit(f"served round {round_number} failed: {summary['failure_reasons']}")
            row = {"round": round_number, "offline_tok_s": round(offline, 1),
                   "served_tok_s": round(summary["output_tok_s"], 1),
                   "served_over_offline": round(summary["output_tok_s"] / offline, 3),
                   "served_ttft_p50_ms": round(summary["ttft_ms"]["p50"], 1),
                   "served_itl_p50_ms": round(summary["itl_ms"]["p50"], 2),
                   "offline_cores": round(offline_cores, 2),
                   "served_engine_cores": round(server_cores - loop_cores, 2),
                   "served_loop_cores": round(loop_cores, 2), "client_cores": round(client_cores, 2)}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        served.stop_server(proc)
    report = {"engine": served.engine_line(log), "concurrency": args.concurrency,
              "input_len": args.input_len, "output_len": args.output_len, "requests_per_round": num_prompts,
              "rounds": rows,
              "offline_tok_s_median": statistics.median(r["offline_tok_s"] for r in rows),
              "served_tok_s_median": statistics.median(r["served_tok_s"] for r in rows),
              "served_over_offline_median": statistics.median(r["served_over_offline"] for r in rows)}
    if args.profile and args.profile.exists():
        report["gil"] = gil_summary(args.profile)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
