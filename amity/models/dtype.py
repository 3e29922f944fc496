"""Choosing the compute dtype.

`auto` is bfloat16 on a GPU. On a CPU it depends on the instruction set (AMX,
AVX512-BF16 or neither), so we measure instead of assuming: a short timed matmul
of the shapes a small model's decode runs, in float32 and in bfloat16, once per
process. A single timing flipped between runs on a noisy 2-core machine, so the
two are timed in alternating rounds, each dtype keeps its best round, and
bfloat16 must win by a clear margin (BF16_MARGIN): on CPUs without native bf16
a near tie is noise, not a reason to lose float32 accuracy.
"""

import functools
import time

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


BF16_MARGIN = 0.8  # bfloat16 must take under 80% of float32's time
ROUNDS = 5


@functools.cache
def fastest_cpu_dtype() -> torch.dtype:
    # A batch of 32 rows: decode batches are where the dtypes part ways on CPUs without
    # native bf16 (at 1-8 rows the two come close and noise decides).
    operands = {dtype: (torch.randn(32, 1024, dtype=dtype), torch.randn(4096, 1024, dtype=dtype))
                for dtype in (torch.float32, torch.bfloat16)}

    def seconds(dtype: torch.dtype) -> float:
        x, w = operands[dtype]
        torch.nn.functional.linear(x, w)
        start = time.perf_counter()
        for _ in range(10):
            torch.nn.functional.linear(x, w)
        return time.perf_counter() - start

    best = {dtype: float("inf") for dtype in operands}
    for _ in range(ROUNDS):
        for dtype in operands:
            best[dtype] = min(best[dtype], seconds(dtype))
    return torch.bfloat16 if best[torch.bfloat16] < BF16_MARGIN * best[torch.float32] else torch.float32


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return DTYPES[name]
    return torch.bfloat16 if device.type == "cuda" else fastest_cpu_dtype()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
