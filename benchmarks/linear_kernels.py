"""The CPU linear kernels of each `--quantization` scheme on the default model's layer
shapes, side by side in one process: milliseconds for the matmuls of all 30 decoder
layers (q/k/v, o, gate/up, down; not the LM head) at each token count.

    .venv/bin/python benchmarks/linear_kernels.py --tokens 1 4 8 32 128

Every layer has its own random weights, as in the model, so they stream from memory
as in a decode step rather than sitting in cache. Besides the `--quantization`
schemes, `Q4_0`, `Q4_1` and `Q8_0` are the block kernel that `auto` runs on GGUF
files of those types (the weights quantized by the gguf package's reference code),
and `Q4_K`, `Q6_K` its super-block formats (random blocks: the gguf package
quantizes no K-quant, and the time does not depend on the values). K-quants need
every layer's inputs to be a multiple of 256, which SmolLM2's 576 is not:

    .venv/bin/python benchmarks/linear_kernels.py --shapes qwen3-0.6b --layers 8 \
        --schemes bf16 Q8_0 Q6_K Q4_0 Q4_K --tokens 1 8 32
On a CPU with AMX, `bf16-amx` is the `bf16` scheme on tiles, and `Q4_1+tiles` (also
`Q4_0+tiles`, `Q8_0+tiles`) the block kernel with every token a prompt token, which
`--prompt-tiles auto` runs on tiles (models/prompt_rows.py):

    .venv/bin/python benchmarks/linear_kernels.py --schemes bf16 bf16-amx Q4_1 Q4_1+tiles --tokens 1 8 32 128

The schemes take turns, one pass each per round (A, B, A, B ...), so that a drift
of a shared machine does not decide a ratio; each figure is the median over the
rounds. Prints one JSON line per token count.
"""

import argparse
import json
import statistics
import time

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants
from torch import nn

from amity.models.cpu_kernels import load_cpu_kernels
from amity.models.k_quants import SUB_BLOCK
from amity.models.prompt_rows import PromptRows
from amity.models.quantization import BLOCK_FORMATS, file_block_layer, quantize_model

# (out, in) of each layer's matmuls, q/k/v and gate/up one matmul each (MergedLinear), and
# the layer count. SmolLM2-135M: hidden 576, intermediate 1536, 9 query and 3 KV heads
# of 64. Qwen3-0.6B: hidden 1024, intermediate 3072, 16 query and 8 KV heads of 128.
SHAPES = {"smollm2-135m": ([(960, 576), (576, 576), (3072, 576), (576, 1536)], 30),
          "qwen3-0.6b": ([(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)], 28)}


def _file_rows(scheme: str, weight: torch.Tensor) -> torch.Tensor:
    """A GGUF file's bytes for `weight` in block type `scheme`."""
    qtype = GGMLQuantizationType[scheme]
    if scheme not in SUB_BLOCK:
        return torch.from_numpy(quants.quantize(weight.numpy(), qtype))
    block_inputs, block_bytes = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(weight.shape[0] * 7919 + weight.shape[1])
    blocks = rng.integers(0, 256, (weight.numel() // block_inputs, block_bytes), dtype=np.uint8)
    for at in ([0, 2] if scheme == "Q4_K" else [208]):  # finite float16 d (and dmin)
        blocks[:, at:at + 2] = rng.uniform(0, 1e-3, (blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
    return torch.from_numpy(blocks.reshape(weight.shape[0], -1))


def build(scheme: str, shapes: list[tuple[int, int]]) -> list[tuple[nn.Module, int]]:
    linears = [nn.Linear(k, n, bias=False) for n, k in shapes]
    kind, _, tiles = scheme.partition("+")
    if kind in BLOCK_FORMATS:
        layers = [file_block_layer(linear, kind, [_file_rows(kind, linear.weight.detach())])
                  for linear in linears]
        if tiles:  # every token as a prompt token
            rows = PromptRows()
            rows.set_step(torch.ones(8192, dtype=torch.bool))
            for layer in layers:
                layer.prompt_rows = rows
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
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="smollm2-135m",
                        help="whose layer shapes")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers. Default: the model's")
    args = parser.parse_args()
    layer_shapes, num_layers = SHAPES[args.shapes]
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    load_cpu_kernels()
    torch.manual_seed(0)
    models = {scheme: build(scheme, layer_shapes * (args.layers or num_layers)) for scheme in args.schemes}
    with torch.no_grad():
        for num_tokens in args.tokens:
            inputs = {k: torch.randn(num_tokens, k) for _, k in layer_shapes}
            times: dict[str, list[float]] = {scheme: [] for scheme in args.schemes}
            for scheme, layers in models.items():  # a warm-up pass each
                one_pass(layers, inputs)
            for _ in range(args.rounds):
                for scheme, layers in models.items():
                    times[scheme].append(one_pass(layers, inputs))
            row = {"shapes": args.shapes, "tokens": num_tokens, "threads": torch.get_num_threads()}
            row.update({f"{s}_ms": round(statistics.median(t) * 1e3, 2) for s, t in times.items()})
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
