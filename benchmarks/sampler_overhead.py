"""Sampler overhead: decode step time with every generation control on versus plain
greedy, at batch 32, on the same engine in the same run. Target: under 15%.

    .venv/bin/python benchmarks/sampler_overhead.py --batch 32 --output-len 64

Both runs decode exactly batch x output-len tokens (min_tokens = max_tokens), so
the difference is the sampling pipeline and the stop checks alone.
"""

import argparse
import json
import time

from amity.config import EngineConfig
from amity.engine.llm_engine import LLMEngine
from amity.engine.sampling_params import SamplingParams


def all_controls(output_len: int, seed: int) -> SamplingParams:
    return SamplingParams(
        temperature=0.8, top_k=50, top_p=0.9, min_p=0.02, xtc_threshold=0.1, xtc_probability=0.5,
        repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.3,
        logit_bias={42: 2.0, 1000: -5.0}, no_repeat_ngram=4, bad_word_tokens=[[198, 198], [11]],
        stop=["\n\n\n\n", "THE END"], stop_tokens=[[2, 2]], min_tokens=output_len,
        max_tokens=output_len, seed=seed, logprobs=5)


def timed_decode(engine: LLMEngine, prompts, params_for) -> float:
    """Seconds per decode step, timing only steps where every request decodes."""
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{time.monotonic_ns()}-{i}", ids, params_for(i))
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running) \
            or engine.scheduler.waiting:
        engine.step()
    steps, start = 0, time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    engine = LLMEngine(EngineConfig(model=args.model, dtype=args.dtype, kv_cache_memory="1GiB",
                                    max_num_seqs=args.batch, enable_prefix_caching=False))
    prompts = [engine.tokenizer.encode(f"Story number {i}: once upon a time") for i in range(args.batch)]
    greedy = lambda i: SamplingParams(temperature=0, max_tokens=args.output_len, min_tokens=args.output_len)
    controls = lambda i: all_controls(args.output_len, seed=i)
    timed_decode(engine, prompts, greedy)  # warm-up
    greedy_s, controls_s = [], []
    for _ in range(args.repeats):  # interleaved, so drift in machine load hits both
        greedy_s.append(timed_decode(engine, prompts, greedy))
        controls_s.append(timed_decode(engine, prompts, controls))
    g, c = sorted(greedy_s)[len(greedy_s) // 2], sorted(controls_s)[len(controls_s) // 2]
    print(json.dumps({"batch": args.batch, "dtype": args.dtype, "greedy_step_ms": round(g * 1e3, 2),
                      "all_controls_step_ms": round(c * 1e3, 2), "overhead": round(c / g - 1, 3)}))


if __name__ == "__main__":
    main()
