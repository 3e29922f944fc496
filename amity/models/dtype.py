"""Choosing the compute dtype, and the KV cache's.

`auto` is bfloat16 on a GPU and float32 on a CPU. On a CPU every linear layer and
attention run through our kernels (quantization.py, attention.py), which compute
in float32 whatever the dtype: bfloat16 there only halves the bytes of the
weights, which helps a memory-bound single stream, and costs accuracy in the
norms, residuals and activations that torch keeps in bfloat16. That trade is the
user's to make (`--dtype bfloat16`), not a default.

The KV cache follows the weights' precision (`resolve_kv_cache_dtype`), as vLLM's
follows the model dtype and llama.cpp keeps float16 K/V. Decode attention reads
every cached K/V row of every sequence each step at memory speed, so its bytes set
a many-stream step's length. A model whose linear layers keep integer weights (the
file's GGUF blocks, int8, int4) keeps K/V in int8, a scale for each 32 values
(attention.py): 72 bytes a 64-value row against bfloat16's 128, for an error well
below the weights' own (benchmarks/README.md, session 24). One with bfloat16 weights keeps bfloat16
K/V, rounded once as written and widened as read (sessions 13 and 18). Float32
weights (a float32 checkpoint, or `--dtype float32`, the reference path) keep
float32 K/V.
"""

import os

import torch

from amity.models.cpu_kernels import load_cpu_kernels
from amity.models.host_memory import keep_freed_memory

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return DTYPES[name]
    return torch.bfloat16 if device.type == "cuda" else torch.float32


KV_CACHE_DTYPES = {**DTYPES, "int8": torch.int8}


def resolve_kv_cache_dtype(name: str, dtype: torch.dtype, weights: str) -> torch.dtype:
    """`--kv-cache-dtype`: auto is the model's dtype, or for a float32 model whose
    linear layers keep narrower weights (`weights`, quantization.py's weight_storage)
    int8 under integer weights and bfloat16 under 16-bit ones; a float32 model may
    keep K/V in any of float32, bfloat16, float16 and int8 (attention.py)."""
    if name == "auto":
        if dtype != torch.float32:
            return dtype
        return {"integer": torch.int8, "16-bit": torch.bfloat16}.get(weights, torch.float32)
    if KV_CACHE_DTYPES[name] != dtype and dtype != torch.float32:
        raise ValueError(f"--kv-cache-dtype {name} with a {str(dtype).removeprefix('torch.')} model: "
                         "a 16-bit model keeps K/V in its own dtype (a float32 one may narrow them)")
    return KV_CACHE_DTYPES[name]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def prepare_device(device_name: str, dtype_name: str,
                   num_threads: int | None) -> tuple[torch.device, torch.dtype]:
    """An engine's device and dtype; on a CPU, its thread count set, our kernels built
    and freed host memory kept for the next step (host_memory.py)."""
    device = resolve_device(device_name)
    if device.type == "cpu":
        torch.set_num_threads(num_threads or os.cpu_count() or 1)
        load_cpu_kernels()
        keep_freed_memory()
    return device, resolve_dtype(dtype_name, device)
