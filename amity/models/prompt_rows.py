"""Prompt tokens on AMX tiles, generated tokens on the int8 blocks (`--prompt-tiles auto`, the default).

On a CPU with AMX, a GGUF Q4_0 / Q4_1 / Q8_0 layer can run tokens on tiles: its
weights dequantized to bfloat16 a panel at a time, the activations rounded to
bfloat16, float32 sums (csrc/block_linear.cpp). From a few dozen tokens up that is
2-4x the int8 blocks' throughput; one token's weights still stream faster through
the int8 blocks, and a decode step is one token per sequence. The two paths round
differently, so the path a token takes must not depend on its batch: it is the
token's own, by position. Prompt positions take tiles, generated (and forced)
positions the int8 blocks, in every step, chunk, preemption and recompute alike.
Attention takes the same mask (csrc/paged_attention.cpp): prompt rows on bfloat16
tiles where the KV cache is bfloat16, generated rows on its float32 loops.
A cached KV block is reused only by a request that would compute its tokens the
same way: kv_cache_manager.py hashes where the prompt ends inside a block, where
roles change numbers at all (`rows_differ_by_role`, quantization.py: not for a
float32 checkpoint on a float32 cache). The LM head stays on the int8 blocks for
every row.

`PromptRows` holds the step's row mask: one buffer that every such layer shares and
the runner rewrites in place each step (as LoRA's slots), so compiled graphs read
the current step's.
"""

import torch
from torch import nn

from amity.models.cpu_kernels import cpu_has_amx_bf16, load_cpu_kernels

TILE_KINDS = ("Q4_0", "Q4_1", "Q8_0")  # the block types csrc/block_linear.cpp runs on tiles


def resolve_prompt_tiles(setting: str, device: torch.device) -> bool:
    """`--prompt-tiles auto`: on where this CPU has AMX and Linux grants this process
    the tile state."""
    if setting == "off" or device.type != "cpu" or not cpu_has_amx_bf16():
        return False
    load_cpu_kernels()
    return bool(torch.ops.amity.amx_tiles())


def find_prompt_rows(model: nn.Module) -> "PromptRows | None":
    return next((m for m in model.modules() if isinstance(m, PromptRows)), None)


class PromptRows(nn.Module):
    def __init__(self, capacity: int = 8192):
        super().__init__()
        self.register_buffer("mask", torch.zeros(capacity, dtype=torch.bool), persistent=False)

    def set_step(self, prompt_rows: torch.Tensor) -> None:
        """`prompt_rows` [T] bool: which of the step's tokens sit at prompt positions."""
        num_tokens = prompt_rows.shape[0]
        if num_tokens > self.mask.shape[0]:  # a step past --max-num-batched-tokens' usual sizes
            self.mask = torch.zeros(2 * num_tokens, dtype=torch.bool)
        self.mask[:num_tokens] = prompt_rows
