"""What `--compile` buys: eager against compiled decode, interleaved, in one process.

Builds the default model twice (eager and compiled before serving, `--compile true`), times
the compiled one's start-up compile, then runs rounds of c=1 and c=32 (N prompts x
INPUT tokens, OUTPUT tokens each, min = max tokens) alternating eager and compiled, and
prints the medians as JSON. Cold compile: point TORCHINDUCTOR_CACHE_DIR at an empty
directory; warm: run again with the same one.

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) .venv/bin/python benchmarks/compile_gain.py
"""

import argparse
import json
import os
import statistics
import time

from amity.config import EngineConfig
from amity.engine.llm_engine import LLMEngine
from benchmarks.offline_throughput import greedy_tokens_per_s, make_prompts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    args = parser.parse_args()
    engines = {}
    build_s = {}
    for mode in ("false", "true"):
        started = time.perf_counter()
        engines[mode] = LLMEngine(EngineConfig(compile=mode, kv_cache_memory="512MiB"))
        build_s[mode] = time.perf_counter() - started
    prompts = make_prompts(engines["false"].tokenizer, max(args.concurrency), args.input_len)
    for engine in engines.values():  # the first steps of a process are slower
        greedy_tokens_per_s(engine, prompts[:1], 8)
    rates = {(mode, c): [] for mode in engines for c in args.concurrency}
    for _ in range(args.rounds):
        for c in args.concurrency:
            for mode, engine in engines.items():
                rates[mode, c].append(greedy_tokens_per_s(engine, prompts[:c], args.output_len))
    result = {"inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
              "eager_start_s": round(build_s["false"], 1),
              "compiled_start_s": round(build_s["true"], 1),
              "load_avg": os.getloadavg()}
    for c in args.concurrency:
        eager = statistics.median(rates["false", c])
        compiled = statistics.median(rates["true", c])
        result[f"c={c}"] = {"eager_tok_s": round(eager, 1), "compiled_tok_s": round(compiled, 1),
                            "ratio": round(compiled / eager, 3),
                            "eager_rounds": [round(r, 1) for r in rates["false", c]],
                            "compiled_rounds": [round(r, 1) for r in rates["true", c]]}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
