"""Offline step times of the compiled default engine: decode at batch 1, 8, 32 and a 128-token prefill.

`--measure` builds `LLMEngine(EngineConfig(compile=...))` on the default model and times
`engine.step()`: for each batch size B, B requests of 128-token prompts decode 48 greedy
tokens (min = max tokens) and the steps after every request's prefill are the decode
steps; a prefill step is one fresh 128-token prompt (distinct tokens: no prefix-cache
hit). Prints one JSON line of medians in milliseconds.

`--trees NAME=PATH ...` compares source trees (e.g. main and a branch): it runs
`--measure` in a fresh process per tree and round with PYTHONPATH=PATH, rounds
interleaved with the order flipped every round (A B, B A, A B ...) so that drift on a
shared machine falls on both, and prints the medians of the rounds and each tree's
ratio to the first:

    TORCH_EXTENSIONS_DIR=/work/ext /work/main/.venv/bin/python benchmarks/decode_step.py \\
        --trees before=/work/main after=$PWD --rounds 3
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BATCH_SIZES = (1, 8, 32)
PROMPT_LEN = 128
DECODE_TOKENS = 48
PREFILLS = 5


def _median_ms(seconds: list[float]) -> float:
    return round(statistics.median(seconds) * 1e3, 3)


def measure(compile_mode: str, kv_cache_memory: str, kv_cache_dtype: str, num_threads: int | None,
            model: str | None) -> dict:
    import torch

    from amity.config import EngineConfig
    from amity.engine.llm_engine import LLMEngine
    from amity.engine.sampling_params import SamplingParams

    started = time.perf_counter()
    engine = LLMEngine(EngineConfig(model=model, compile=compile_mode, kv_cache_memory=kv_cache_memory,
                                    kv_cache_dtype=kv_cache_dtype, num_threads=num_threads))
    result = {"build_s": round(time.perf_counter() - started, 1)}
    tokens = torch.Generator().manual_seed(0)

    def prompt() -> list[int]:
        return torch.randint(100, engine.vocab_size - 100, (PROMPT_LEN,), generator=tokens).tolist()

    decode = SamplingParams(temperature=0, max_tokens=DECODE_TOKENS, min_tokens=DECODE_TOKENS)
    engine.generate([prompt()], SamplingParams(temperature=0, max_tokens=8))  # a process's first steps are slower
    for batch in BATCH_SIZES:
        waiting_first = {f"b{batch}-{i}" for i in range(batch)}
        for request_id in waiting_first:
            engine.add_request(request_id, prompt(), decode)
        step_s = []
        while engine.has_unfinished_requests():
            decoding = not waiting_first
            started = time.perf_counter()
            outputs = engine.step()
            if decoding:
                step_s.append(time.perf_counter() - started)
            waiting_first -= {out.request_id for out in outputs}
        result[f"decode_b{batch}_ms"] = _median_ms(step_s)
    prefill_s = []
    for i in range(PREFILLS):
        engine.add_request(f"prefill-{i}", prompt(), SamplingParams(temperature=0, max_tokens=1))
        started = time.perf_counter()
        engine.step()
        prefill_s.append(time.perf_counter() - started)
        while engine.has_unfinished_requests():
            engine.step()
    result[f"prefill_{PROMPT_LEN}_ms"] = _median_ms(prefill_s)
    result["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    return result


def compare(trees: list[tuple[str, str]], rounds: int, passthrough: list[str]) -> dict:
    runs: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for r in range(rounds):
        for name, path in (trees if r % 2 == 0 else trees[::-1]):
            env = dict(os.environ, PYTHONPATH=path)
            done = subprocess.run([sys.executable, __file__, "--measure", *passthrough], env=env,
                                  check=True, capture_output=True, text=True)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(name, runs[name][-1], file=sys.stderr, flush=True)
    metrics = [key for key in runs[trees[0][0]][0] if key.endswith("_ms")]
    summary: dict = {"rounds": rounds, "load_avg": [run["load_avg"] for name in runs for run in runs[name]]}
    base = trees[0][0]
    for name, _ in trees:
        summary[name] = {m: statistics.median(run[m] for run in runs[name]) for m in metrics}
        summary[name]["rounds"] = {m: [run[m] for run in runs[name]] for m in metrics}
        if name != base:
            summary[f"{name}/{base}"] = {m: round(summary[name][m] / summary[base][m], 3) for m in metrics}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--measure", action="store_true", help="measure this process's tree")
    parser.add_argument("--trees", nargs="+", metavar="NAME=PATH", help="compare these source trees")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compile", default="true", help="the engine's --compile: true, false or auto")
    parser.add_argument("--kv-cache-memory", default="512MiB")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--model", default=None, help="the engine's --model (default: the default model)")
    parser.add_argument("--omp-wait-policy", default="bounded", help="as `amity serve`'s (the default)")
    parser.add_argument("--num-threads", type=int, default=None,
                        help="torch threads (default: all cores); 1 on a machine other work keeps busy")
    args = parser.parse_args()
    if args.measure:
        from amity.omp_wait_policy import apply_omp_wait_policy  # before torch loads
        apply_omp_wait_policy(args.omp_wait_policy)
        print(json.dumps(measure(args.compile, args.kv_cache_memory, args.kv_cache_dtype, args.num_threads,
                                 args.model)))
    elif args.trees:
        trees = [tuple(tree.split("=", 1)) for tree in args.trees]
        passthrough = ["--compile", args.compile, "--kv-cache-memory", args.kv_cache_memory,
                       "--kv-cache-dtype", args.kv_cache_dtype,
                       "--omp-wait-policy", args.omp_wait_policy]
        if args.num_threads:
            passthrough += ["--num-threads", str(args.num_threads)]
        if args.model:
            passthrough += ["--model", args.model]
        print(json.dumps(compare(trees, args.rounds, passthrough), indent=1))
    else:
        parser.error("--measure or --trees")


if __name__ == "__main__":
    main()
