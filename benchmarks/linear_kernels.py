"""The CPU linear kernels of each `--quantization` scheme on the default model's layer
shapes, side by side in one process: milliseconds for the matmuls of all 30 decoder
layers (q/k/v, o, gate/up, down; not the LM head) at each token count.

    .venv/bin/python benchmarks/linear_kernels.py --tokens 1 4 8 32 128

Every layer has its own random weights, as in the model, so they stream from memory
as in a decode step rather than sitting in cache. Besides the `--quantization`
schemes, `Q4_0`, `Q4_1` and `Q8_0` are the block kernel that `auto` runs on GGUF
files of those types (the weights quantized by the gguf package's reference code).
The schemes take turns, one pass each per round (A, B, A, B ...), so that a drift
of a shared machine does not decide a ratio; each figure is the median over the
rounds. Prints one JSON line per token count.
"""

import argparse
import json
import statistics
import time

import torch
from gguf import GGMLQuantizationType, quants
from torch import nn

from amity.models.cpu_kernels import load_cpu_kernels
from amity.models.quantization import BLOCK_FORMATS, BlockLinear, file_blocks, quantize_model

# SmolLM2-135M: hidden 576, intermediate 1536, 9 query and 3 KV heads of 64; q/k/v and
# gate/up are one matmul each (MergedLinear).
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
NUM_LAYERS = 30


def build(scheme: str) -> list[tuple[nn.Module, int]]:
    shapes = LAYER_SHAPES * NUM_LAYERS
    linears = [nn.Linear(k, n, bias=False) for n, k in shapes]
    if scheme in BLOCK_FORMATS:
        qtype = GGMLQuantizationType[scheme]
        layers = [BlockLinear(linear, scheme, *file_blocks(
            scheme, torch.from_numpy(quants.quantize(linear.weight.detach().numpy(), qtype)))) for linear in linears]
    else:
        layers = list(quantize_model(nn.ModuleList(linears), scheme, torch.device("cpu")))
    return [(layer, k) for layer, (_, k) in zip(layers, shapes)]


def one_pass(layers, inputs) -> float:
    start = time.perf_counter()
    for layer, k in layers:
        layer(inputs[k])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 8, 32, 128])
    parser.add_argument("--schemes", nargs="+",
                        default=["bf16-weight", "bf16", "int8-weight", "Q8_0", "Q4_0", "Q4_1", "int8"])
    parser.add_argument("--rounds", type=int, default=7, help="passes per scheme, interleaved")
    parser.add_argument("--num-threads", type=int, default=None)
    args = parser.parse_args()
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    load_cpu_kernels()
    torch.manual_seed(0)
    models = {scheme: build(scheme) for scheme in args.schemes}
    with torch.no_grad():
        for num_tokens in args.tokens:
            inputs = {k: torch.randn(num_tokens, k) for _, k in LAYER_SHAPES}
            times: dict[str, list[float]] = {scheme: [] for scheme in args.schemes}
            for scheme, layers in models.items():  # a warm-up pass each
                one_pass(layers, inputs)
            for _ in range(args.rounds):
                for scheme, layers in models.items():
                    times[scheme].append(one_pass(layers, inputs))
            row = {"tokens": num_tokens, "threads": torch.get_num_threads()}
            row.update({f"{s}_ms": round(statistics.median(t) * 1e3, 2) for s, t in times.items()})
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
