"""Choosing the compute dtype.

`auto` is bfloat16 on a GPU. On a CPU it depends on the instruction set (AMX,
AVX512-BF16 or neither), so we measure instead of assuming: a short timed matmul
of the shapes a small model's decode runs, in float32 and in bfloat16, once per
process.
"""

import functools
import time

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@functools.cache
def fastest_cpu_dtype() -> torch.dtype:
    def seconds(dtype: torch.dtype) -> float:
        x = torch.randn(8, 1024, dtype=dtype)
        w = torch.randn(4096, 1024, dtype=dtype)
        for _ in range(3):
            torch.nn.functional.linear(x, w)
        start = time.perf_counter()
        for _ in range(20):
            torch.nn.functional.linear(x, w)
        return time.perf_counter() - start

    return torch.bfloat16 if seconds(torch.bfloat16) < seconds(torch.float32) else torch.float32


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return DTYPES[name]
    return torch.bfloat16 if device.type == "cuda" else fastest_cpu_dtype()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
