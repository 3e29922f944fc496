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

- `int8`: int8 weights (one scale per output channel) and int8 activations (one
  scale per token, computed on the fly), multiplied by `torch._int_mm` into int32.
  It suits batches: VNNI int8 dot products run several times faster than float32
  GEMM. Because the product is exact integer arithmetic and each token's scale
  depends only on that token, a request's numbers do not depend on what else is in
  its batch.
- `int8-weight`: the same int8 weights with float activations, in the same
  packed kernel, which widens them in registers. It suits a single stream and
  small batches, where a step is bound by reading the weights: it reads a quarter
  of float32's bytes, and it is the most accurate of the three quantized schemes.
- `int4`: weight-only int4 in groups of 32 along the input (a scale and an offset
  per group, the layout of GGUF's Q4_1), multiplied by torch's int4 CPU kernel with
  bfloat16 activations. It suits a single stream, where the step is bound by
  reading the weights.

All are CPU kernels; on a GPU the engine runs the `nn.Linear`s as loaded.
"""

import torch
import torch.nn.functional as F
from torch import nn

INT4_GROUP_SIZE = 32
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


class PackedLinear(nn.Module):
    """Weights in panels of PANEL_ROWS output rows, [N / 32, K, 32], as the kernel
    reads them: int8 with a scale per row, or the float weights as loaded. Rows are
    padded with zeros to whole panels, and the padding cut off the output."""

    def __init__(self, linear: nn.Linear, int8: bool):
        super().__init__()
        if int8:
            weight, scale = _int8_rows(linear)
        else:  # the kernel reads float32 and bfloat16 weights; float16 ones are widened
            weight, scale = linear.weight.detach(), None
            if weight.dtype not in (torch.float32, torch.bfloat16):
                weight = weight.float()
        self.out_features, in_features = weight.shape
        pad = -self.out_features % PANEL_ROWS  # zero rows; whatever their scale, their outputs are cut off
        panels = F.pad(weight, (0, 0, 0, pad)).reshape(-1, PANEL_ROWS, in_features).transpose(1, 2)
        self.register_buffer("weight_packed", panels.contiguous())
        self.register_buffer("weight_scale", None if scale is None else F.pad(scale, (0, pad)))
        bias = _float_bias(linear)
        self.bias = None if bias is None else nn.Parameter(F.pad(bias, (0, pad)), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = torch.ops.amity.packed_linear(x.reshape(-1, shape[-1]), self.weight_packed, self.weight_scale,
                                            self.bias)
        if out.shape[-1] != self.out_features:
            out = out[:, :self.out_features]
        # Not `-1`: a step can ask a layer for no rows at all (an LM head with nothing to sample).
        return out.reshape(*shape[:-1], self.out_features)


class Int4Linear(nn.Module):
    def __init__(self, linear: nn.Linear, group_size: int = INT4_GROUP_SIZE):
        super().__init__()
        weight = linear.weight.detach().float()
        out_features, in_features = weight.shape
        if in_features % group_size:
            raise ValueError(f"int4 needs in_features divisible by {group_size}, got {in_features}")
        groups = weight.reshape(out_features, in_features // group_size, group_size)
        low, high = groups.amin(dim=-1), groups.amax(dim=-1)
        scale = ((high - low) / 15).clamp(min=1e-12)
        q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)
        q = q.reshape(out_features, in_features).to(torch.int32)
        # The kernel dequantizes (q - 8) * scale + zero, per group: shift the offset.
        zero = low + 8 * scale
        self.register_buffer("weight_packed", torch._convert_weight_to_int4pack_for_cpu(q, 1))
        self.register_buffer("scales_and_zeros",
                             torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous())
        self.group_size = group_size
        self.bias = _float_bias(linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, dtype = x.shape, x.dtype
        x = x.reshape(-1, shape[-1]).to(torch.bfloat16)
        out = torch._weight_int4pack_mm_for_cpu(x, self.weight_packed, self.group_size,
                                                self.scales_and_zeros).to(dtype)
        if self.bias is not None:
            out = out + self.bias.to(dtype)
        return out.reshape(*shape[:-1], out.shape[-1])


_LAYERS = {
    "none": lambda linear: PackedLinear(linear, int8=False),
    "int8": Int8Linear,
    "int8-weight": lambda linear: PackedLinear(linear, int8=True),
    "int4": Int4Linear,
}


def quantize_model(model: nn.Module, scheme: str, device: torch.device) -> nn.Module:
    """Replace every `nn.Linear` of `model` (the LM head included) by its CPU layer,
    in place; the token embedding stays as loaded. On a GPU, `none` keeps the
    `nn.Linear`s."""
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
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, _LAYERS[scheme](child))
    model.amity_linear_scheme = scheme
    return model
