"""LoRA around a loaded model: many adapters over one base, mixed in one batch.

`apply_lora` wraps each decoder layer's q/k/v/o and gate/up/down projection in a
`LoraLinear`, as quantization.py swaps in its layers: the model stays the plain
module it was, and the base layer inside stays whatever it becomes (packed,
quantized). Each wrapped layer adds `scale * (x @ A_i) @ B_i` to the base output,
where i is the adapter of the token's request.

The adapters live in `max_loras` slots of stacked factors, every one padded to
`max_rank` (zero rows and columns add exact zeros): A of all slots is one
[slots * rank, in] matrix, so `x @ A` computes every slot's down-projection in
one matmul; a per-token mask (`LoraBatch`, set once per step from the adapter
index of each token) zeroes the columns of every slot but the token's own, and
one more matmul against the stacked B [out, slots * rank] (its rows scaled by
each adapter's scale) gives each token its own adapter's update. Two matmuls a
projection whatever the mix of adapters, no loop over requests or adapters, and
shapes that depend only on the number of tokens, so `--compile` keeps one graph.
A base-model token (slot -1) gets an all-zero mask: it adds exact zeros.

On a CPU both matmuls run through our packed kernel (csrc/packed_linear.cpp),
whose outputs for a token never depend on the other tokens of its batch: a
request computes the same numbers alone or in any mix of adapters. Elsewhere
they are plain `F.linear`s.
"""

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from amity.models.llama import MergedLinear
from amity.models.peft_adapter import LoraAdapter
from amity.models.quantization import pack_panels

_PROJECTION = re.compile(r"^model\.layers\.(\d+)\.(?:self_attn|mlp)\.(qkv_proj|o_proj|gate_up_proj|down_proj)$")


class LoraBatch(nn.Module):
    """The step's tokens' adapter slots, as a mask over the stacked ranks:
    token_mask[t, s * rank + r] is 1 where token t uses slot s. A buffer written in
    place each step (`set_step`), so compiled graphs read the current step's."""

    def __init__(self, max_loras: int, max_rank: int, max_num_tokens: int, dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        self.register_buffer("slot_of_column", torch.arange(max_loras, device=device).repeat_interleave(max_rank))
        self.register_buffer("token_mask", torch.zeros(max_num_tokens, max_loras * max_rank, dtype=dtype,
                                                       device=device))

    def set_step(self, token_slots: torch.Tensor) -> None:
        """`token_slots` [T]: each token's adapter slot, -1 for the base model."""
        num_tokens = token_slots.shape[0]
        if num_tokens > self.token_mask.shape[0]:
            raise ValueError(f"a step of {num_tokens} tokens exceeds the LoRA batch of {self.token_mask.shape[0]} "
                             "(--max-num-batched-tokens)")
        self.token_mask[:num_tokens] = (token_slots[:, None] == self.slot_of_column).to(self.token_mask.dtype)


class SlotMatrix(nn.Module):
    """A [N, K] matrix of stacked adapter factors applied as a linear layer.
    `weight` is written slot by slot; `refresh` then repacks it for the CPU kernel."""

    def __init__(self, out_features: int, in_features: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.out_features = out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=dtype, device=device))
        self.packed = device.type == "cpu"
        if self.packed:
            self.register_buffer("weight_packed", pack_panels(self.weight))

    def refresh(self) -> None:
        if self.packed:
            self.weight_packed.copy_(pack_panels(self.weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.packed:
            return F.linear(x, self.weight)
        out = torch.ops.amity.packed_linear(x, self.weight_packed, None, None)
        return out[:, :self.out_features] if out.shape[1] != self.out_features else out


class LoraLinear(nn.Module):
    """A base projection (possibly several merged, e.g. q/k/v: `shards`) plus the
    LoRA update of each token's adapter, one A and B per shard and slot."""

    wraps_base = True  # quantization.py: `base` has the checkpoint names of the layer wrapped

    def __init__(self, base: nn.Module, in_features: int, shards: list[tuple[str, int]], batch: LoraBatch,
                 max_loras: int, max_rank: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.base = base
        self.batch = batch
        self.shard_names = [name for name, _ in shards]
        self.max_rank = max_rank
        self.width = max_loras * max_rank  # columns of one shard's stacked ranks
        self.lora_a = SlotMatrix(len(shards) * self.width, in_features, dtype, device)
        self.lora_b = nn.ModuleList(SlotMatrix(size, self.width, dtype, device) for _, size in shards)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        num_tokens = x.shape[0]
        mask = self.batch.token_mask[:num_tokens]
        xa = self.lora_a(x).view(num_tokens, len(self.lora_b), self.width) * mask[:, None, :]
        deltas = [b(xa[:, j]) for j, b in enumerate(self.lora_b)]
        return out + (deltas[0] if len(deltas) == 1 else torch.cat(deltas, dim=-1))

    @torch.no_grad()
    def write(self, slot: int, adapter: LoraAdapter | None, layer: int) -> None:
        """Put `adapter`'s factors for this layer in `slot` (None: clear it)."""
        columns = slice(slot * self.max_rank, (slot + 1) * self.max_rank)
        for j, (name, b) in enumerate(zip(self.shard_names, self.lora_b)):
            a_rows = self.lora_a.weight[j * self.width:(j + 1) * self.width][columns]
            b_columns = b.weight[:, columns]
            a_rows.zero_()
            b_columns.zero_()
            factors = adapter.modules.get((layer, name)) if adapter is not None else None
            if factors is not None:
                a_rows[:factors.rank] = factors.a
                b_columns[:, :factors.rank] = factors.b * factors.scale
            b.refresh()
        self.lora_a.refresh()


@dataclass
class LoraSlots:
    """A model's LoRA side: write an adapter into a slot, clear one, and set which
    slot each token of a step uses."""

    batch: LoraBatch
    layers: dict[int, list[LoraLinear]]  # decoder layer index -> its wrapped projections
    layer_shapes: dict[str, tuple[int, int]]  # projection name -> (in_features, out_features)
    max_loras: int
    max_rank: int

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def write(self, slot: int, adapter: LoraAdapter | None) -> None:
        for layer, modules in self.layers.items():
            for module in modules:
                module.write(slot, adapter, layer)

    def set_step(self, token_slots: torch.Tensor) -> None:
        self.batch.set_step(token_slots)


def apply_lora(model: nn.Module, max_loras: int, max_rank: int, max_num_tokens: int,
               device: torch.device) -> LoraSlots:
    """Wrap `model`'s decoder projections in `LoraLinear`s, in place, before
    quantization (which then replaces the base layers inside them)."""
    if getattr(model, "amity_linear_scheme", None) is not None:
        raise ValueError("LoRA wraps the model's nn.Linear layers: apply it before quantization")
    if max_loras < 1 or max_rank < 1:
        raise ValueError(f"--max-loras ({max_loras}) and --max-lora-rank ({max_rank}) must be at least 1")
    dtype = next(model.parameters()).dtype
    if device.type == "cpu" and dtype not in (torch.float32, torch.bfloat16):
        dtype = torch.float32  # what the packed kernel reads
    batch = LoraBatch(max_loras, max_rank, max_num_tokens, dtype, device)
    layers: dict[int, list[LoraLinear]] = {}
    shapes: dict[str, tuple[int, int]] = {}
    for path, module in list(model.named_modules()):
        match = _PROJECTION.match(path)
        if match is None:
            continue
        if isinstance(module, MergedLinear):
            shards = list(zip(module.shard_names, module.output_sizes))
        else:
            shards = [(match.group(2), module.out_features)]
        for name, size in shards:
            shapes[name] = (module.in_features, size)
        wrapped = LoraLinear(module, module.in_features, shards, batch, max_loras, max_rank, dtype, device)
        parent, _, attr = path.rpartition(".")
        setattr(model.get_submodule(parent), attr, wrapped)
        layers.setdefault(int(match.group(1)), []).append(wrapped)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no decoder projections to adapt with LoRA")
    return LoraSlots(batch, layers, shapes, max_loras, max_rank)
