"""LoRA serving cost: output tokens/s at concurrency C (all requests submitted at
once to the offline engine, continuously batched) for the base model without LoRA,
and on one LoRA engine for base-only requests, one adapter for every request, and
`--num-adapters` adapters mixed evenly, in one run. Prints one JSON object.

    .venv/bin/python benchmarks/lora.py --concurrency 32 --input-len 64 --output-len 64

The adapters are random-weight PEFT directories written here for the served model
(every q/k/v/o/gate/up/down projection, rank `--rank`): their values do not change
the cost. Output length is fixed (min = max tokens). Each figure is the best of
`--repeats` runs, taken round-robin.
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from amity.config import EngineConfig
from amity.engine.llm_engine import LLMEngine
from amity.engine.sampling_params import SamplingParams
from offline_throughput import make_prompts  # a sibling script: its folder is on the path


def write_adapter(engine: LLMEngine, directory: Path, rank: int, seed: int) -> Path:
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(engine.model_config.num_hidden_layers):
        for name, (in_features, out_features) in engine.lora.slots.layer_shapes.items():
            part = "self_attn" if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_features, generator=generator) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, rank, generator=generator) * 0.01
    directory.mkdir()
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": rank}))
    return directory


def tokens_per_s(engine: LLMEngine, prompts, routes, output_len: int) -> float:
    engine.kv.pool.reset_prefix_cache()
    for route in set(routes):  # warm-up, uncounted
        engine.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=2, adapter=route))
    engine.kv.pool.reset_prefix_cache()
    start = time.perf_counter()
    for i, (prompt, route) in enumerate(zip(prompts, routes)):
        params = SamplingParams(temperature=0, max_tokens=output_len, min_tokens=output_len, eos_token=[],
                                adapter=route)
        engine.add_request(f"bench-{i}", prompt, params)
    num_tokens = 0
    while engine.has_unfinished_requests():
        num_tokens += sum(len(c.new_token_ids) for out in engine.step() for c in out.outputs)
    elapsed = time.perf_counter() - start
    assert num_tokens == len(prompts) * output_len
    return num_tokens / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--num-adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    common = dict(model=args.model, dtype=args.dtype, quantization=args.quantization, kv_cache_memory="1GiB",
                  max_num_seqs=max(args.concurrency, 1))
    base = LLMEngine(EngineConfig(**common))
    lora = LLMEngine(EngineConfig(**common, enable_lora=True, max_loras=args.num_adapters,
                                  max_lora_rank=args.rank))
    routes = [f"adapter-{i}" for i in range(args.num_adapters)]
    with tempfile.TemporaryDirectory() as tmp:
        for i, route in enumerate(routes):
            lora.load_lora_adapter(route, str(write_adapter(lora, Path(tmp) / route, args.rank, i)))
    prompts = make_prompts(base.tokenizer, args.concurrency, args.input_len)
    n = len(prompts)
    runs = {"base_no_lora": (base, [None] * n), "lora_engine_base_only": (lora, [None] * n),
            "one_adapter": (lora, [routes[0]] * n),
            f"{args.num_adapters}_adapters_mixed": (lora, [routes[i % len(routes)] for i in range(n)])}
    # Round-robin repeats, best of each: other work on a shared machine only slows a run down.
    best = dict.fromkeys(runs, 0.0)
    for _ in range(args.repeats):
        for name, (engine, run_routes) in runs.items():
            best[name] = max(best[name], tokens_per_s(engine, prompts, run_routes, args.output_len))
    results = {"concurrency": args.concurrency, "input_len": args.input_len, "output_len": args.output_len,
               "rank": args.rank, "quantization": args.quantization, "repeats": args.repeats, **best,
               "mixed_vs_base_no_lora": best[f"{args.num_adapters}_adapters_mixed"] / best["base_no_lora"]}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
