"""The decode attention kernel alone (`torch.ops.amity.paged_attention`), as a 32-stream
decode step of the default model calls it (`--seqs` for other batches): 32 sequences of 128-256 keys in 16-token
blocks scattered through the pool, 9 query heads on 3 KV heads of 64, one call per
layer, each layer with its own cache (so the step reads from memory, as the engine's
does). Prints, per cache dtype, the median milliseconds of the layers' calls and the
K/V bytes they read per second.

    TORCH_EXTENSIONS_DIR=/work/ext .venv/bin/python benchmarks/decode_attention.py --dtypes float32 float16
    .venv/bin/python benchmarks/decode_attention.py --layers 1 --rounds 300   # one layer's 10 MB: from L3, not memory
    .venv/bin/python benchmarks/decode_attention.py --seqs 1 --rounds 300     # a single stream's calls
"""

import argparse
import statistics
import time

import torch

from amity.models.attention import as_cached, kv_row_elements
from amity.models.cpu_kernels import load_cpu_kernels

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float16", "bfloat16", "int8"])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seqs", type=int, default=32, help="sequences a call (1: a single stream's step)")
    args = parser.parse_args()
    NUM_SEQS = args.seqs
    load_cpu_kernels()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    context_lens = torch.randint(128, 257, (NUM_SEQS,), generator=g)
    blocks_per_seq = (context_lens + BLOCK_SIZE - 1) // BLOCK_SIZE
    num_blocks = int(blocks_per_seq.sum())
    shuffled = torch.randperm(num_blocks, generator=g)
    tables = torch.zeros(NUM_SEQS, int(blocks_per_seq.max()), dtype=torch.long)
    offset = 0
    for s, n in enumerate(blocks_per_seq.tolist()):
        tables[s, :n] = shuffled[offset:offset + n]
        offset += n
    last = context_lens - 1  # each sequence's new token goes to its last position
    slots = tables[torch.arange(NUM_SEQS), last // BLOCK_SIZE] * BLOCK_SIZE + last % BLOCK_SIZE
    query_start = torch.arange(NUM_SEQS + 1)
    q = torch.randn(NUM_SEQS, NUM_HEADS, HEAD_DIM)
    k, v = torch.randn(NUM_SEQS, NUM_KV_HEADS, HEAD_DIM), torch.randn(NUM_SEQS, NUM_KV_HEADS, HEAD_DIM)
    for name in args.dtypes:
        dtype = getattr(torch, name)
        shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        caches = [(as_cached(torch.randn(shape), dtype), as_cached(torch.randn(shape), dtype))
                  for _ in range(args.layers)]
        seconds = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            for k_cache, v_cache in caches:
                torch.ops.amity.paged_attention(q, k, v, k_cache, v_cache, slots, query_start, context_lens,
                                                tables, HEAD_DIM ** -0.5)
            seconds.append(time.perf_counter() - started)
        median_s = statistics.median(seconds)
        nbytes = int(context_lens.sum()) * NUM_KV_HEADS * kv_row_elements(HEAD_DIM, dtype) * 2 * args.layers * dtype.itemsize
        print(f"{name}: {median_s * 1e3:.2f} ms for {args.layers} layers, {nbytes / 1e6:.0f} MB of K/V, "
              f"{nbytes / median_s / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
