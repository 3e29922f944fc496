"""CPU linear layers, swapped in around a loaded model (`quantize_model`).

The model stays a plain `nn.Module` built from `nn.Linear`s; these layers replace
them afterwards, so loading, parity tests and every architecture share one model
definition. On the CPU every scheme runs through a kernel of ours or torch's,
chosen by measurement on CPUs like this one (see benchmarks/README.md, "Linear
kernels"):

- `auto` (the default): each layer as the file gives its weight (the loader
  records how, file_weights.py). GGUF Q4_0, Q4_1 and Q8_0 blocks run through the
  block kernel (csrc/block_linear.cpp, `BlockLinear`) on the file's bytes, times
  int8 activations per block of 32 as llama.cpp computes them, and so do Q4_K and
  Q6_K super-blocks (`SuperBlockLinear`, k_quants.py); a tied LM head reads the
  embedding's blocks (Q8_0 in the default model). bfloat16 weights run in `bf16`
  where the CPU has AVX512-BF16, else in `bf16-weight`; float32 and float16 ones
  in `none`. Block types without a kernel of ours (Q5_*, Q2_K, Q3_K, Q5_K) are
  widened to bfloat16. The engine turns `auto` into `none` under an explicit
  `--dtype float32` (`resolve_scheme`): the float32 reference path. On a CPU with
  AMX, the prompt tokens of Q4_0 / Q4_1 / Q8_0 layers (not the LM head) run on
  tiles instead under `--prompt-tiles auto` (the default), their weights dequantized to
  bfloat16 (prompt_rows.py): 1.3-2x the int8 blocks' prefill throughput.

- `none`: the loaded float32 or bfloat16 weights, in the panel layout of our C++
  kernel (csrc/packed_linear.cpp, `PackedLinear`). torch's own CPU matmuls run a
  decode step's few tokens at a fraction of memory speed (bfloat16 ones on CPUs
  without native bf16 slower still); this kernel streams the weights near it, and
  for a prefill's many tokens it runs at about 90% of float32 GEMM (MKL). Every token's
  result is the same float computation whatever else is in its batch.

- `bf16-weight`: the weights rounded to bfloat16 in the same kernel, with float32
  activations. It reads the bytes of `--dtype bfloat16` without computing the rest
  of the model in bfloat16: argmax agreement with float32 99.7% against bfloat16's
  97-98%, at the same speed or better (four A/B pairs here: two 14-15 against 17-18
  ms a decode step, two equal).

- `bf16`: bfloat16 weights times activations rounded to bfloat16, float32 sums,
  by AVX512-BF16's vdpbf16ps where the CPU has it (csrc/bf16_linear.cpp,
  `Bf16Linear`): two products per lane and instruction, from the weights as they
  are, so prefills run about 1.7x faster than `bf16-weight`, which widens them.
  Rounding the activations costs a little accuracy (argmax 99.3-99.4% against
  99.3-99.9%). One chain per output in a fixed order at every batch size.
- `bf16-amx`: the same bfloat16 weights and activations on AMX tiles, on CPUs
  that have them: a tile step multiplies 16 tokens by 16 input pairs by 16
  outputs, so batches and prefills run 2.5-3.8x faster than `bf16` (32-128
  tokens), while one token runs about 1.3x slower (its step reads the weights
  slower through tiles than vdpbf16ps's loads do). Its sums round differently from
  vdpbf16ps's, so it is a scheme of its own rather than `bf16` switching by batch
  size (which would make a token's numbers depend on its batch); `auto` keeps
  `bf16`, the faster one for a single stream.

- `int8`: int8 weights (one scale per output channel) and int8 activations (one
  scale per token, computed on the fly), multiplied by `torch._int_mm` into int32.
  It suits batches: VNNI int8 dot products run several times faster than float32
  GEMM. Because the product is exact integer arithmetic and each token's scale
  depends only on that token, a request's numbers do not depend on what else is in
  its batch.
- `int8-weight`: the same int8 weights with float activations, in the same
  packed kernel, which widens them in registers. It suits a single stream and
  small batches, where a step is bound by reading the weights: it reads a quarter
  of float32's bytes.
- `int4`: GGUF's Q4_1 (blocks of 32 inputs, 4-bit q with a float16 scale and
  offset each) times int8 activations per block of 32, as llama.cpp's CPU backend
  computes it (csrc/block_linear.cpp, `BlockLinear`): the weights stream at 5 bits
  each and VNNI does the block sums, so it is the fastest scheme from one stream
  to 32. On a Q4_1 file (the default model) its blocks are the file's own, bit for
  bit, and it is then the most accurate of the quantized schemes. The LM head is
  kept at 8 bits (`int8-weight`), as Q4_1 files keep their output matrix. Exact
  integer block sums and per-token scales keep a request's numbers independent of
  its batch.

All are CPU kernels; on a GPU the engine runs the `nn.Linear`s as loaded.
"""

import logging

import torch
import torch.nn.functional as F
from torch import nn

from amity.models.cpu_kernels import cpu_has, cpu_has_amx_bf16, load_cpu_kernels
from amity.models.file_weights import FileWeight
from amity.models.k_quants import SUB_BLOCK, SUPER_BLOCK, KQuantBlocks, k_quant_blocks
from amity.models.llama import MergedLinear
from amity.models.prompt_rows import TILE_KINDS, PromptRows, find_prompt_rows

logger = logging.getLogger(__name__)

Q4_1_BLOCK = 32  # inputs per Q4_1 block
PANEL_ROWS = 32  # csrc/packed_linear.cpp's NR


def _float_bias(linear: nn.Linear) -> nn.Parameter | None:
    if linear.bias is None:
        return None
    return nn.Parameter(linear.bias.detach().float(), requires_grad=False)


def _int8_rows(linear: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 weights [out, in] with one float32 scale per output row."""
    weight = linear.weight.detach().float()
    scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
    return torch.round(weight / scale[:, None]).to(torch.int8), scale


class Int8Linear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight, scale = _int8_rows(linear)
        # _int_mm takes [M, K] x [K, N]: keep the weight transposed once, here.
        self.register_buffer("weight_t", weight.t().contiguous())
        self.register_buffer("weight_scale", scale)
        self.bias = _float_bias(linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, dtype = x.shape, x.dtype
        x = x.reshape(-1, shape[-1]).float()
        token_scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
        x_int8 = torch.round(x / token_scale).to(torch.int8)
        out = torch._int_mm(x_int8, self.weight_t).float() * (token_scale * self.weight_scale)
        if self.bias is not None:
            out = out + self.bias
        return out.to(dtype).reshape(*shape[:-1], self.weight_t.shape[1])


class _PanelLinear(nn.Module):
    """What the panel kernels' layers share: outputs padded with zero rows to whole
    panels of PANEL_ROWS (whatever their scale, their outputs are cut off), a float
    bias padded alike, and `kernel` on the flattened tokens."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.out_features = linear.weight.shape[0]
        self.padding_rows = -self.out_features % PANEL_ROWS
        bias = _float_bias(linear)
        self.bias = None if bias is None else nn.Parameter(F.pad(bias, (0, self.padding_rows)),
                                                           requires_grad=False)

    def kernel(self, x: torch.Tensor) -> torch.Tensor:  # [T, K] -> [T, padded N]
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = self.kernel(x.reshape(-1, shape[-1]))
        if out.shape[-1] != self.out_features:
            out = out[:, :self.out_features]
        # Not `-1`: a step can ask a layer for no rows at all (an LM head with nothing to sample).
        return out.reshape(*shape[:-1], self.out_features)


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """A [N, K] weight in csrc/packed_linear.cpp's layout, [ceil(N / 32), K, 32],
    its outputs padded with zero rows to whole panels."""
    padding_rows = -weight.shape[0] % PANEL_ROWS
    padded = F.pad(weight, (0, 0, 0, padding_rows))
    return padded.reshape(-1, PANEL_ROWS, weight.shape[1]).transpose(1, 2).contiguous()


class PackedLinear(_PanelLinear):
    """Weights in panels of PANEL_ROWS output rows, [N / 32, K, 32], as
    csrc/packed_linear.cpp reads them: `weights` is "loaded" (the float weights as
    loaded), "bfloat16" (rounded to it) or "int8" (with a scale per row)."""

    def __init__(self, linear: nn.Linear, weights: str):
        super().__init__(linear)
        weight, scale = linear.weight.detach(), None
        if weights == "int8":
            weight, scale = _int8_rows(linear)
        elif weights == "bfloat16":
            weight = weight.bfloat16()
        elif weight.dtype not in (torch.float32, torch.bfloat16):  # the kernel reads these; float16 is widened
            weight = weight.float()
        self.register_buffer("weight_packed", pack_panels(weight))
        self.register_buffer("weight_scale", None if scale is None else F.pad(scale, (0, self.padding_rows)))

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.amity.packed_linear(x, self.weight_packed, self.weight_scale, self.bias)


# csrc/block_linear.cpp's formats: GGUF block type -> the kernel's format number.
BLOCK_FORMATS = {"Q4_0": 0, "Q4_1": 1, "Q8_0": 2, "Q4_K": 3, "Q6_K": 4}
_FILE_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}  # ggml's block_q4_0, block_q4_1, block_q8_0


def file_blocks(kind: str, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A GGUF matrix's raw blocks ([out, bytes per row] uint8, as the file holds
    them) as the kernel's q (uint8 [out, in], stored with the format's zero point
    added: 8 for Q4_0 as in the file, 128 for Q8_0), d and m (float16 [out, in /
    32]; m for Q4_1 only), byte for byte."""
    out_features = rows.shape[0]
    blocks = rows.reshape(out_features, -1, _FILE_BLOCK_BYTES[kind])

    def halves(at: int) -> torch.Tensor:
        return blocks[..., at:at + 2].contiguous().view(torch.float16).squeeze(-1)

    if kind == "Q8_0":  # d, then 32 int8 q; stored as q + 128, i.e. the sign bit flipped
        return (blocks[..., 2:] ^ 0x80).reshape(out_features, -1), halves(0), None
    quants = blocks[..., 4:] if kind == "Q4_1" else blocks[..., 2:]
    q = torch.cat([quants & 15, quants >> 4], dim=-1).reshape(out_features, -1)  # element j low, j + 16 high
    return q, halves(0), halves(2) if kind == "Q4_1" else None


def q4_1_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GGUF's Q4_1 of a float [out, in] weight, as ggml's quantize_row_q4_1_ref makes
    it: per 32 inputs, d = (max - min) / 15 and m = min (stored as float16), and
    q = min(15, floor((w - min) / d + 0.5)) with the float32 d. Returns q (uint8,
    [out, in]), d and m (float16, [out, in / 32]); the weight is q * d + m.

    A weight dequantized from a Q4_1 file comes back as the file's own blocks (a
    test checks the default model), so `int4` computes with exactly its weights.
    """
    out_features, in_features = weight.shape
    if in_features % Q4_1_BLOCK:
        raise ValueError(f"int4 needs in_features divisible by {Q4_1_BLOCK}, got {in_features}")
    groups = weight.float().reshape(out_features, in_features // Q4_1_BLOCK, Q4_1_BLOCK)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    d = (high - low) / 15
    inverse = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    q = torch.floor((groups - low[..., None]) * inverse[..., None] + 0.5).clamp(max=15)
    return q.reshape(out_features, in_features).to(torch.uint8), d.half(), low.half()


def _quads(q: torch.Tensor, nibbles: bool) -> torch.Tensor:
    """q [padded out, in] uint8 -> csrc/block_linear.cpp's quads, [panel, block of 32
    inputs, 8 quads x (64 or 128) bytes]: per quad of 4 inputs, 4-bit q as byte
    4i + j = output i's (low nibble) and output i + 16's (high nibble) input j, or
    one byte each, outputs 0-15 then 16-31."""
    num_panels, num_blocks = q.shape[0] // PANEL_ROWS, q.shape[1] // Q4_1_BLOCK
    # [panel, block, quad, output, input in quad]
    q = q.reshape(num_panels, PANEL_ROWS, num_blocks, Q4_1_BLOCK // 4, 4).permute(0, 2, 3, 1, 4)
    if nibbles:
        q = q[:, :, :, :16] | (q[:, :, :, 16:] << 4)
    return q.reshape(num_panels, num_blocks, -1)


def _per_panel(scales: torch.Tensor) -> torch.Tensor:
    """[padded out, groups, ...] (one value per output and group) -> [panel, group,
    bytes]: a group's values for the panel's 32 outputs side by side, as bytes."""
    num_panels = scales.shape[0] // PANEL_ROWS
    by_panel = scales.reshape(num_panels, PANEL_ROWS, scales.shape[1], -1).transpose(1, 2)  # [panel, group, out, ...]
    return by_panel.transpose(2, 3).contiguous().view(torch.uint8).reshape(num_panels, scales.shape[1], -1)


class BlockLinear(_PanelLinear):
    """Weights in a GGUF block format (`kind`: Q4_0, Q4_1 or Q8_0) in the panels of
    csrc/block_linear.cpp, [N / 32, K / 32, block bytes] uint8, times int8
    activations per block of 32 (that file says how and why). q, d, m as
    `file_blocks` gives them."""

    def __init__(self, linear: nn.Linear, kind: str, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None):
        super().__init__(linear)
        self.format = BLOCK_FORMATS[kind]
        self.prompt_rows: PromptRows | None = None  # set by quantize_model under --prompt-tiles
        in_features = q.shape[1]
        if in_features % Q4_1_BLOCK:
            raise ValueError(f"{kind} needs in_features divisible by {Q4_1_BLOCK}, got {in_features}")
        pad = (0, 0, 0, self.padding_rows)  # zero scales: padded rows give zeros
        quads = _quads(F.pad(q, pad), nibbles=kind != "Q8_0")
        parts = [quads, _per_panel(F.pad(d, pad))] + ([_per_panel(F.pad(m, pad))] if m is not None else [])
        self.register_buffer("weight_packed", torch.cat(parts, dim=-1).contiguous())

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        tile_rows = self.prompt_rows.mask if self.prompt_rows is not None else None
        return torch.ops.amity.block_linear(x, self.weight_packed, self.format, self.bias, tile_rows)


def _six_bit_tops(tops: torch.Tensor) -> torch.Tensor:
    """Q6_K's top 2 bits of q, [padded out, in] -> [panel, block, quad, 32] bytes: in
    a quad's VNNI lane bytes (4i + j: output i's input j; outputs 0-15 in one vector,
    16-31 in the other), byte c holds the first vector's lane bytes c and c + 32 in
    bits 0-1 and 2-3, the second's in bits 4-5 and 6-7 (csrc/block_linear.cpp)."""
    num_panels, num_blocks = tops.shape[0] // PANEL_ROWS, tops.shape[1] // Q4_1_BLOCK
    lanes = tops.reshape(num_panels, PANEL_ROWS, num_blocks, Q4_1_BLOCK // 4, 4).permute(0, 2, 3, 1, 4)
    lanes = lanes.reshape(num_panels, num_blocks, Q4_1_BLOCK // 4, 2, 64)  # [.., vector, lane byte]
    return (lanes[..., 0, :32] | (lanes[..., 0, 32:] << 2) | (lanes[..., 1, :32] << 4)
            | (lanes[..., 1, 32:] << 6))


class SuperBlockLinear(_PanelLinear):
    """Weights in a GGUF K-quant (`Q4_K`, `Q6_K`; k_quants.py) in the super-block
    panels of csrc/block_linear.cpp, [N / 32, K / 256, super-block bytes] uint8:
    per panel and 256 inputs, d (and dmin) for its 32 outputs, then each
    sub-block's sc (then each's m), then the quads as BlockLinear's 4-bit ones
    (Q6_K: each quad followed by its q's top 2 bits, `_six_bit_tops`). Same int8
    activations per block of 32 as BlockLinear."""

    def __init__(self, linear: nn.Linear, blocks: KQuantBlocks):
        super().__init__(linear)
        self.format = BLOCK_FORMATS[blocks.kind]
        in_features = blocks.q.shape[1]
        if in_features % SUPER_BLOCK:
            raise ValueError(f"{blocks.kind} needs in_features divisible by {SUPER_BLOCK}, got {in_features}")
        pad = (0, 0, 0, self.padding_rows)  # zero scales: padded rows give zeros
        num_supers = in_features // SUPER_BLOCK

        def per_super(values: torch.Tensor) -> torch.Tensor:  # [out, n x per super] -> [panel, super, bytes]
            return _per_panel(F.pad(values, pad).reshape(values.shape[0] + self.padding_rows, num_supers, -1))

        q = F.pad(blocks.q, pad)
        quads = _quads(q & 15, nibbles=True)
        if blocks.kind == "Q6_K":
            quads = torch.cat([quads.reshape(*quads.shape[:2], -1, 64), _six_bit_tops(q >> 4)], dim=-1)
        quads = quads.reshape(quads.shape[0], num_supers, -1)
        fields = [blocks.d, blocks.dmin, blocks.sc, blocks.m]
        parts = [per_super(f) for f in fields if f is not None] + [quads]
        self.register_buffer("weight_packed", torch.cat(parts, dim=-1).contiguous())

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.amity.block_linear(x, self.weight_packed, self.format, self.bias)


def file_block_layer(linear: nn.Linear, kind: str, shards: list[torch.Tensor]) -> nn.Module:
    """The block kernel's layer for a GGUF block type, from the raw bytes of each
    shard of `linear` ([out, bytes per row] uint8 as the file holds them), in order."""
    if kind in SUB_BLOCK:
        return SuperBlockLinear(linear, KQuantBlocks.cat([k_quant_blocks(kind, rows) for rows in shards]))
    parts = [file_blocks(kind, rows) for rows in shards]
    q, d, m = (None if part[0] is None else torch.cat(part) for part in zip(*parts))
    return BlockLinear(linear, kind, q, d, m)


def q4_1_linear(linear: nn.Linear) -> BlockLinear:
    """`int4`: the float weights in Q4_1."""
    return BlockLinear(linear, "Q4_1", *q4_1_blocks(linear.weight.detach()))


class Bf16Linear(_PanelLinear):
    """`bf16`: bfloat16 weights in the pairs layout of csrc/bf16_linear.cpp,
    [N / 32, K / 2, 64], times activations rounded to bfloat16, float32 sums;
    `tiles`: on AMX tiles (`bf16-amx`) rather than vdpbf16ps."""

    def __init__(self, linear: nn.Linear, tiles: bool = False):
        super().__init__(linear)
        self.tiles = tiles
        weight = F.pad(linear.weight.detach().bfloat16(), (0, linear.weight.shape[1] % 2, 0, self.padding_rows))
        in_features = weight.shape[1]
        # [panel, pair, half, output in half, input in pair]
        pairs = weight.reshape(-1, 2, 16, in_features // 2, 2).permute(0, 3, 1, 2, 4)
        self.register_buffer("weight_packed", pairs.reshape(-1, in_features // 2, 2 * PANEL_ROWS).contiguous())

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] % 2:
            x = F.pad(x, (0, 1))
        return torch.ops.amity.bf16_linear(x, self.weight_packed, self.bias, self.tiles)


def _amx_bf16_linear(linear: nn.Linear) -> Bf16Linear:
    if not cpu_has_amx_bf16():
        raise ValueError("--quantization bf16-amx needs a CPU with AMX (amx_bf16 and amx_tile in "
                         "/proc/cpuinfo); this one has none: use bf16")
    load_cpu_kernels()
    if not torch.ops.amity.amx_tiles():
        raise ValueError("--quantization bf16-amx: the kernels' build has no AMX (a C++ compiler that "
                         "does not know it) or Linux did not grant this process AMX's tile state")
    return Bf16Linear(linear, tiles=True)


_LAYERS = {
    "none": lambda linear: PackedLinear(linear, "loaded"),
    "bf16": Bf16Linear,
    "bf16-amx": _amx_bf16_linear,
    "bf16-weight": lambda linear: PackedLinear(linear, "bfloat16"),
    "int8": Int8Linear,
    "int8-weight": lambda linear: PackedLinear(linear, "int8"),
    "int4": q4_1_linear,
}
SCHEMES = ("auto", *_LAYERS)
# Q4_1 files keep the output matrix at 8 bits (the default model's tied embedding is
# Q8_0): 4-bit logits cost far more accuracy than 4-bit layers.
_LM_HEAD_LAYERS = {"int4": _LAYERS["int8-weight"]}


def weight_storage(model: nn.Module) -> str:
    """How the narrowest linear layers of `model` keep their weights: "integer" (file
    blocks, int8, int4), "16-bit" (bfloat16) or "float32": what `--kv-cache-dtype auto`
    follows on a CPU (dtype.py)."""
    dtypes = {buffer.dtype for module in model.modules() if isinstance(module, (_PanelLinear, Int8Linear))
              for name, buffer in module.named_buffers(recurse=False) if name in ("weight_packed", "weight_t")}
    if any(not dtype.is_floating_point for dtype in dtypes):
        return "integer"
    return "16-bit" if dtypes - {torch.float32} else "float32"


def rows_differ_by_role(model: nn.Module, kv_cache_dtype: torch.dtype, head_dim: int) -> bool:
    """Whether a token's numbers depend on its role, prompt or generated (prompt_rows.py),
    which the prefix cache must respect (kv_cache_manager.py): a linear layer runs prompt
    rows on tiles, or attention does, which it does only on a bfloat16 KV cache with
    head_dim a multiple of 32 up to 256 (csrc/paged_attention.cpp's `tiles`). A float32
    checkpoint on a float32 cache computes every row one way, mask or not."""
    if find_prompt_rows(model) is None:
        return False
    attention_tiles = kv_cache_dtype == torch.bfloat16 and head_dim % 32 == 0 and head_dim <= 256
    return attention_tiles or any(isinstance(m, BlockLinear) and m.prompt_rows is not None
                                  for m in model.modules())


def resolve_scheme(quantization: str, dtype: str) -> str:
    """`auto` serves weights as the file gives them, except under an explicit
    `--dtype float32`: that is the float32 reference path (`none`)."""
    return "none" if quantization == "auto" and dtype == "float32" else quantization


def _bfloat16_scheme() -> str:
    # vdpbf16ps where the CPU has it; elsewhere bfloat16 weights with float32 activations.
    return "bf16" if cpu_has("avx512_bf16") else "bf16-weight"


def _file_layer(linear: nn.Linear, formats: list[FileWeight]) -> nn.Module:
    """`auto`: the layer for `linear` whose weight the file stores as `formats`
    (one per shard of a MergedLinear, in order)."""
    kinds = {f.kind for f in formats}
    kind = next(iter(kinds)) if len(kinds) == 1 else None
    if kind in BLOCK_FORMATS:
        return file_block_layer(linear, kind, [f.blocks() for f in formats])
    if kind == "bfloat16":
        return _LAYERS[_bfloat16_scheme()](linear)
    if not formats or kinds <= {"float32", "float16"}:  # float16 widens to float32 exactly
        return PackedLinear(linear, "loaded")
    # A block type without a kernel of ours (Q5_*, Q2_K, Q3_K, Q5_K) or shards of
    # different types: bfloat16, as llama.cpp's converters widen what they cannot keep.
    logger.info("%s weights (%s) run in bfloat16: no kernel for them as they are",
                "/".join(sorted(kinds)), "x".join(map(str, linear.weight.shape)))
    return _LAYERS[_bfloat16_scheme()](linear)


def _checkpoint_names(model: nn.Module) -> dict[int, list[str]]:
    """id(nn.Linear) -> the checkpoint names of its weight: a MergedLinear's shards
    in order; a tied LM head's is the embedding's."""
    # A wrapper (LoRA's LoraLinear) names its wrapped layer `base`, which the file does not.
    wrappers = {q for q, m in model.named_modules() if getattr(m, "wraps_base", False)}

    def in_file(qualified: str) -> str:
        parts = qualified.split(".")
        return ".".join(p for i, p in enumerate(parts)
                        if not (p == "base" and ".".join(parts[:i]) in wrappers))

    param_names = {id(p): in_file(name) for name, p in model.named_parameters()}  # tied: first name
    names = {}
    for qualified, module in model.named_modules():
        qualified = in_file(qualified)
        if isinstance(module, MergedLinear):
            parent = qualified.rpartition(".")[0]
            names[id(module)] = [f"{parent}.{shard}.weight".lstrip(".") for shard in module.shard_names]
        elif isinstance(module, nn.Linear):
            names[id(module)] = [param_names[id(module.weight)]]
    return names


def quantize_model(model: nn.Module, scheme: str, device: torch.device,
                   file_weights: dict[str, FileWeight] | None = None, prompt_tiles: bool = False) -> nn.Module:
    """Replace every `nn.Linear` of `model` (the LM head included, in int8 for
    `int4`) by its CPU layer, in place; the token embedding stays as loaded. `auto`
    picks each layer by how the file stores its weight (`file_weights`, from the
    loader; without one, `none`). On a GPU, `none` and `auto` keep the `nn.Linear`s.
    `prompt_tiles`: Q4_0 / Q4_1 / Q8_0 layers but the LM head run prompt tokens on
    AMX tiles (prompt_rows.py; the caller checks that the CPU has them), and so does
    the attention of modules with a `prompt_rows` slot (llama.py's)."""
    if scheme not in SCHEMES:
        raise ValueError(f"quantization {scheme!r} is not one of {list(SCHEMES)}")
    if device.type != "cpu":
        if scheme in ("none", "auto"):
            return model
        raise ValueError(f"--quantization {scheme} uses CPU kernels; on {device.type} use "
                         "--quantization none")
    # An engine built on a model another engine already converted (tests share one
    # loaded model) finds its layers in place: fine if the scheme is the same.
    done = getattr(model, "amity_linear_scheme", None)
    if done is not None:
        if (done, model.amity_prompt_tiles) != (scheme, prompt_tiles):
            raise ValueError(f"this model's linear layers are already {done!r} (prompt tiles: "
                             f"{model.amity_prompt_tiles}); load it again for {scheme!r} ({prompt_tiles})")
        return model
    lm_head = getattr(model, "lm_head", None)
    names = _checkpoint_names(model) if scheme == "auto" else {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            if scheme == "auto":
                formats = [file_weights[n] for n in names[id(child)] if n in (file_weights or {})]
                layer = _file_layer(child, formats if len(formats) == len(names[id(child)]) else [])
            else:
                make = _LM_HEAD_LAYERS.get(scheme, _LAYERS[scheme]) if child is lm_head else _LAYERS[scheme]
                layer = make(child)
            setattr(parent, name, layer)
    if prompt_tiles:
        rows, tile_formats = PromptRows(), {BLOCK_FORMATS[kind] for kind in TILE_KINDS}
        for module in model.modules():
            if isinstance(module, BlockLinear) and module.format in tile_formats and \
                    module is not getattr(model, "lm_head", None):
                module.prompt_rows = rows
            elif not isinstance(module, BlockLinear) and hasattr(module, "prompt_rows"):
                module.prompt_rows = rows
    model.amity_linear_scheme, model.amity_prompt_tiles = scheme, prompt_tiles
    return model
