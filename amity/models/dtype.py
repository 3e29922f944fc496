"""Choosing the compute dtype.

`auto` is bfloat16 on a GPU and float32 on a CPU. On a CPU every linear layer and
attention run through our kernels (quantization.py, attention.py), which compute
in float32 whatever the dtype: bfloat16 there only halves the bytes of the
weights and the KV cache, which helps a memory-bound single stream, and costs
accuracy in the norms, residuals and activations that torch keeps in bfloat16.
That trade is the user's to make (`--dtype bfloat16`), not a default.
"""

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name != "auto":
        return DTYPES[name]
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
