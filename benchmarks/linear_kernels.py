"""The CPU linear kernels of each `--quantization` scheme on the default model's layer
shapes, side by side in one process: milliseconds for the matmuls of all 30 decoder
layers (q/k/v, o, gate/up, down; not the LM head) at each token count.

    .venv/bin/python benchmarks/linear_kernels.py --tokens 1 4 8 32 128

Every layer has its own random weights, as in the model, so they stream from memory
as in a decode step rather than sitting in cache. Prints one JSON line per token count.
"""

import argparse
import json
import time

import torch
from torch import nn

from amity.models.cpu_kernels import load_cpu_kernels
from amity.models.quantization import quantize_model

# SmolLM2-135M: hidden 576, intermediate 1536, 9 query and 3 KV heads of 64; q/k/v and
# gate/up are one matmul each (MergedLinear).
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
NUM_LAYERS = 30


def time_scheme(scheme: str, num_tokens: int, repeats: int) -> float:
    shapes = LAYER_SHAPES * NUM_LAYERS
    model = quantize_model(nn.ModuleList(nn.Linear(k, n, bias=False) for n, k in shapes), scheme,
                           torch.device("cpu"))
    layers = [(layer, k) for layer, (_, k) in zip(model, shapes)]
    inputs = {k: torch.randn(num_tokens, k) for _, k in LAYER_SHAPES}
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            for layer, k in layers:
                layer(inputs[k])
            best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 8, 32, 128])
    parser.add_argument("--schemes", nargs="+", default=["none", "bf16-weight", "int8-weight", "int4", "int8"])
    parser.add_argument("--repeats", type=int, default=7, help="best of this many passes")
    parser.add_argument("--num-threads", type=int, default=None)
    args = parser.parse_args()
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    load_cpu_kernels()
    torch.manual_seed(0)
    for num_tokens in args.tokens:
        row = {"tokens": num_tokens, "threads": torch.get_num_threads()}
        for scheme in args.schemes:
            row[f"{scheme}_ms"] = round(time_scheme(scheme, num_tokens, args.repeats) * 1e3, 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
