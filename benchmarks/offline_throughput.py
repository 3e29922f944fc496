"""Offline throughput: amity's engine versus `transformers` `generate`, same run.

The same N prompts x M output tokens go through amity (all submitted at once,
continuously batched) and through `transformers` one request at a time, as a
naive user would run them. Output length is fixed on both sides (min = max
tokens), so both produce exactly N x M tokens. Prints one JSON object.

    .venv/bin/python benchmarks/offline_throughput.py --num-prompts 8 --output-len 64
"""

import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM

from amity.config import EngineConfig
from amity.engine.llm_engine import LLMEngine
from amity.engine.sampling_params import SamplingParams
from amity.models.dtype import resolve_dtype

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly "
         "hex bold jump zebras near forty old mills ").split()


def make_prompts(tokenizer, num_prompts: int, input_len: int) -> list[list[int]]:
    prompts = []
    for i in range(num_prompts):
        words = [WORDS[(i * 7 + j) % len(WORDS)] for j in range(input_len * 2)]
        prompts.append(tokenizer.encode(" ".join(words))[:input_len])
    return prompts


def greedy_tokens_per_s(engine: LLMEngine, prompts, output_len: int, concurrency: int | None = None) -> float:
    """Output tokens per second of greedy generation, exactly `output_len` tokens a
    prompt, `concurrency` prompts at a time (default: all at once)."""
    params = SamplingParams(temperature=0, max_tokens=output_len, min_tokens=output_len)
    at_once = concurrency or len(prompts)
    start = time.perf_counter()
    for first in range(0, len(prompts), at_once):
        finals = engine.generate(prompts[first:first + at_once], params)
        assert all(len(f.ordered_choices[0].token_ids) == output_len for f in finals)
    return len(prompts) * output_len / (time.perf_counter() - start)


def run_amity(engine: LLMEngine, prompts, output_len: int) -> float:
    engine.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    return greedy_tokens_per_s(engine, prompts, output_len)


def run_transformers(model_path, dtype, prompts, output_len: int) -> float:
    path = model_path
    if path.is_file():
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.eval()
    with torch.inference_mode():
        model.generate(torch.tensor([prompts[0]]), max_new_tokens=4, do_sample=False)  # warm-up
        start = time.perf_counter()
        for ids in prompts:
            out = model.generate(torch.tensor([ids]), max_new_tokens=output_len,
                                 min_new_tokens=output_len, do_sample=False)
            assert out.shape[1] - len(ids) == output_len
        elapsed = time.perf_counter() - start
    return len(prompts) * output_len / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--num-prompts", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--quantization", nargs="+", default=["none"],
                        help="amity runs once per scheme listed (auto, none, bf16, bf16-weight, int8, int8-weight, int4)")
    parser.add_argument("--compile", default="false", choices=("true", "false"),
                        help="amity with --compile true (torch.compile before the run) or false")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--num-threads", type=int, default=None, help="amity's CPU threads (default: all cores)")
    args = parser.parse_args()

    engines = {q: LLMEngine(EngineConfig(model=args.model, dtype=args.dtype, kv_cache_memory="1GiB",
                                         quantization=q, compile=args.compile,
                                         num_threads=args.num_threads))
               for q in args.quantization}
    first = next(iter(engines.values()))
    dtype = resolve_dtype(args.dtype, first.device)
    model_path = first.model_path
    results = []
    for n in args.num_prompts:
        prompts = make_prompts(first.tokenizer, n, args.input_len)
        row = {"num_prompts": n, "input_len": args.input_len, "output_len": args.output_len,
               "dtype": str(dtype).removeprefix("torch."), "compile": args.compile}
        for q, engine in engines.items():
            row[f"amity_{q}_tokens_per_s"] = round(run_amity(engine, prompts, args.output_len), 2)
        if not args.skip_transformers:
            hf = run_transformers(model_path, dtype, prompts, args.output_len)
            row["transformers_tokens_per_s"] = round(hf, 2)
            for q in engines:
                row[f"ratio_{q}"] = round(row[f"amity_{q}_tokens_per_s"] / hf, 2)
        results.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps({"model": model_path.name, "threads": torch.get_num_threads(), "results": results}))


if __name__ == "__main__":
    main()
