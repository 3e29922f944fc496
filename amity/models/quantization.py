"""CPU linear layers, swapped in around a loaded model (`quantize_model`).

The model stays a plain `nn.Module` built from `nn.Linear`s; these layers replace
them afterwards, so loading, parity tests and every architecture share one model
definition. On the CPU every scheme runs through a kernel of ours or torch's,
chosen by measurement on CPUs like this one (see benchmarks/README.md, "Linear
kernels"):

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
  computes it (csrc/q4_1_linear.cpp, `Q4_1Linear`): the weights stream at 5 bits
  each and VNNI does the block sums, so it is the fastest scheme from one stream
  to 32. On a Q4_1 file (the default model) its blocks are the file's own, bit for
  bit, and it is then the most accurate of the quantized schemes. The LM head is
  kept at 8 bits (`int8-weight`), as Q4_1 files keep their output matrix. Exact
  integer block sums and per-token scales keep a request's numbers independent of
  its batch.

All are CPU kernels; on a GPU the engine runs the `nn.Linear`s as loaded.
"""

import torch
import torch.nn.functional as F
from torch import nn

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


class Q4_1Linear(_PanelLinear):
    """GGUF Q4_1 weights in the panels of csrc/q4_1_linear.cpp, [N / 32, K / 32, 640]
    uint8, times int8 activations per block of 32 (that file says how and why)."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        in_features = linear.weight.shape[1]
        q, d, m = q4_1_blocks(F.pad(linear.weight.detach().float(), (0, 0, 0, self.padding_rows)))
        num_panels, num_blocks = q.shape[0] // PANEL_ROWS, in_features // Q4_1_BLOCK
        # [panel, block, quad, output, input in quad]; byte 4i + j of a quad holds
        # output i in its low nibble and output i + 16 in its high one.
        q = q.reshape(num_panels, PANEL_ROWS, num_blocks, Q4_1_BLOCK // 4, 4).permute(0, 2, 3, 1, 4)
        quads = (q[:, :, :, :16] | (q[:, :, :, 16:] << 4)).reshape(num_panels, num_blocks, -1)

        def per_block(scales: torch.Tensor) -> torch.Tensor:  # [out, block] float16 -> [panel, block, 64] bytes
            return scales.reshape(num_panels, PANEL_ROWS, num_blocks).transpose(1, 2).contiguous().view(torch.uint8)

        self.register_buffer("weight_packed", torch.cat([quads, per_block(d), per_block(m)], dim=-1).contiguous())

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.amity.q4_1_linear(x, self.weight_packed, self.bias)


_LAYERS = {
    "none": lambda linear: PackedLinear(linear, "loaded"),
    "bf16-weight": lambda linear: PackedLinear(linear, "bfloat16"),
    "int8": Int8Linear,
    "int8-weight": lambda linear: PackedLinear(linear, "int8"),
    "int4": Q4_1Linear,
}
# Q4_1 files keep the output matrix at 8 bits (the default model's tied embedding is
# Q8_0): 4-bit logits cost far more accuracy than 4-bit layers.
_LM_HEAD_LAYERS = {"int4": _LAYERS["int8-weight"]}


def quantize_model(model: nn.Module, scheme: str, device: torch.device) -> nn.Module:
    """Replace every `nn.Linear` of `model` (the LM head included, in int8 for
    `int4`) by its CPU layer, in place; the token embedding stays as loaded. On a
    GPU, `none` keeps the `nn.Linear`s."""
    if scheme not in _LAYERS:
        raise ValueError(f"quantization {scheme!r} is not one of {list(_LAYERS)}")
    if device.type != "cpu":
        if scheme == "none":
            return model
        raise ValueError(f"--quantization {scheme} uses CPU kernels; on {device.type} use "
                         "--quantization none")
    # An engine built on a model another engine already converted (tests share one
    # loaded model) finds its layers in place: fine if the scheme is the same.
    done = getattr(model, "amity_linear_scheme", None)
    if done is not None:
        if done != scheme:
            raise ValueError(f"this model's linear layers are already {done!r}; load it again for {scheme!r}")
        return model
    lm_head = getattr(model, "lm_head", None)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                layer = _LM_HEAD_LAYERS.get(scheme, _LAYERS[scheme]) if child is lm_head else _LAYERS[scheme]
                setattr(parent, name, layer(child))
    model.amity_linear_scheme = scheme
    return model
