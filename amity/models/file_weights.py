"""How a checkpoint stores each weight matrix, for `--quantization auto`.

The loader fills the model's parameters with float tensors (the reference path,
and what every architecture shares); alongside, it records each matrix's format in
the file, so that `quantize_model` can serve it as the file gives it: a GGUF block
type through the kernel for those blocks, with the file's blocks byte for byte,
and a bfloat16 checkpoint in bfloat16.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FileWeight:
    """`kind` is a GGUF block type's name (`Q4_1`, `Q8_0`, ...) or a float dtype's
    (`float32`, `bfloat16`, `float16`). For block types, `blocks()` reads the
    file's bytes: [out_features, bytes per row] uint8, rows in the model's order."""

    kind: str
    blocks: Callable[[], torch.Tensor] | None = None


FLOAT_KINDS = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
