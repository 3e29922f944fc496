"""Sampler overhead: decode step time with every generation control on versus plain
greedy, at batch 32, on the same engine in the same run. Target: under 15%.

    .venv/bin/python benchmarks/sampler_overhead.py --batch 32 --output-len 64

Both runs decode exactly batch x output-len tokens (min_tokens = max_tokens), so
the difference is the sampling pipeline and the stop checks alone.

`--history-len N` measures the sampler alone, no model: random logits over
SmolLM2's vocabulary, greedy with the controls that read the whole history on
(penalties, no_repeat_ngram), each row's history N tokens long and one sampled
token longer per step, torch on one thread. It times one sampler call per decode
step with the rows' token histories kept across steps (the engine's way,
token_history.py) against histories built from the token lists at every step,
interleaved, for each `--batch` given; and the kept histories' first call, which
takes in the whole history.

    .venv/bin/python benchmarks/sampler_overhead.py --history-len 2048 --batch 1 8 32
"""

import argparse
import json
import random
import time

import torch

from amity.config import EngineConfig
from amity.engine.llm_engine import LLMEngine
from amity.engine.sampler import Sampler, SamplingRow
from amity.engine.sampling_params import SamplingParams
from amity.engine.token_history import TokenHistory


def all_controls(output_len: int, seed: int) -> SamplingParams:
    return SamplingParams(
        temperature=0.8, top_k=50, top_p=0.9, min_p=0.02, xtc_threshold=0.1, xtc_probability=0.5,
        repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.3,
        logit_bias={42: 2.0, 1000: -5.0}, no_repeat_ngram=4, bad_word_tokens=[[198, 198], [11]],
        stop=["\n\n\n\n", "THE END"], stop_tokens=[[2, 2]], min_tokens=output_len,
        max_tokens=output_len, seed=seed, logprobs=5)


def history_controls() -> SamplingParams:
    """The controls that read the whole history; greedy, so that sampling itself
    (the same either way) does not hide their cost."""
    return SamplingParams(temperature=0, repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.3,
                          no_repeat_ngram=4)


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


def sampler_step_ms(batch: int, history_len: int, steps: int, keep: bool,
                    vocab_size: int = 49152) -> tuple[float, float]:
    """Milliseconds of the first sampler call, and the median over the `steps`
    decode steps after it."""
    rng = random.Random(batch)
    logits_rng = torch.Generator().manual_seed(batch)
    rows = []
    for _ in range(batch):
        # Text-like: most tokens from a small common set, the rest from anywhere.
        prompt = [rng.randrange(2000) if rng.random() < 0.7 else rng.randrange(vocab_size)
                  for _ in range(history_len)]
        params = history_controls()
        rows.append(SamplingRow(params, prompt, len(prompt), None, frozenset({0}),
                                history=TokenHistory(params) if keep else None))
    sampler, times = Sampler(), []
    for _ in range(steps + 1):
        logits = torch.randn(batch, vocab_size, generator=logits_rng)
        start = time.perf_counter()
        out = sampler(logits, rows)
        times.append(time.perf_counter() - start)
        for row, token in zip(rows, out.token_ids):
            row.token_ids.append(token)
    return times[0] * 1e3, sorted(times[1:])[steps // 2] * 1e3


def sampler_only(args) -> None:
    # One thread: on a shared machine, torch's OpenMP threads wait on each other's
    # cores and swamp the figures; the history work is single-threaded anyway.
    torch.set_num_threads(1)
    sampler_step_ms(1, args.history_len, 2, keep=True)  # torch's own first calls
    for batch in args.batch:
        kept, first, rebuilt = [], [], []
        for _ in range(args.repeats):  # interleaved, so drift in machine load hits both
            first_ms, step_ms = sampler_step_ms(batch, args.history_len, args.output_len, keep=True)
            kept.append(step_ms)
            first.append(first_ms)
            rebuilt.append(sampler_step_ms(batch, args.history_len, args.output_len, keep=False)[1])
        k, r = sorted(kept)[len(kept) // 2], sorted(rebuilt)[len(rebuilt) // 2]
        print(json.dumps({"batch": batch, "history_len": args.history_len, "kept_ms": round(k, 3),
                          "rebuilt_ms": round(r, 3), "speedup": round(r / k, 2),
                          "kept_first_call_ms": round(sorted(first)[len(first) // 2], 3)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, nargs="+", default=[32])
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--history-len", type=int, default=None, help="the sampler alone; see above")
    args = parser.parse_args()
    if args.history_len is not None:
        sampler_only(args)
        return
    (args.batch,) = args.batch  # the engine run takes one batch size

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
