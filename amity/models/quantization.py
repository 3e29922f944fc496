"""Quantized linear layers, swapped in around a loaded model (`quantize_model`).

The model stays a plain `nn.Module` built from `nn.Linear`s; quantization replaces
those layers afterwards, so loading, parity tests and every architecture share one
model definition. Three schemes, chosen by measurement on CPUs like this one (see
benchmarks/README.md, "Quantized matmuls"):

- `int8`: int8 weights (one scale per output channel) and int8 activations (one
  scale per token, computed on the fly), multiplied by `torch._int_mm` into int32.
  It suits batches: VNNI int8 dot products run several times faster than float32
  GEMM. Because the product is exact integer arithmetic and each token's scale
  depends only on that token, a request's numbers do not depend on what else is in
  its batch.
- `int8-weight`: the same int8 weights with float activations, multiplied by our
  C++ kernel (csrc/int8_linear.cpp), which widens the weights in registers. It
  suits a single stream and small batches, where a step is bound by reading the
  weights: it reads a quarter of float32's bytes, and it is the most accurate of
  the three.
- `int4`: weight-only int4 in groups of 32 along the input (a scale and an offset
  per group, the layout of GGUF's Q4_1), multiplied by torch's int4 CPU kernel with
  bfloat16 activations. It suits a single stream, where the step is bound by
  reading the weights.

All are CPU kernels; on a GPU the engine runs the float weights.
"""

import torch
from torch import nn

INT4_GROUP_SIZE = 32


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
        return out.to(dtype).reshape(*shape[:-1], -1)


class Int8WeightLinear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        if linear.in_features % 16:
            raise ValueError(f"int8-weight needs in_features divisible by 16, got {linear.in_features}")
        weight, scale = _int8_rows(linear)
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", scale)
        self.bias = _float_bias(linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = torch.ops.amity.int8_linear(x.reshape(-1, shape[-1]), self.weight, self.weight_scale,
                                          self.bias)
        return out.reshape(*shape[:-1], -1)


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
        return out.reshape(*shape[:-1], -1)


_LAYERS = {"int8": Int8Linear, "int8-weight": Int8WeightLinear, "int4": Int4Linear}


def quantize_model(model: nn.Module, scheme: str, device: torch.device) -> nn.Module:
    """Replace every `nn.Linear` of `model` (the LM head included) by its quantized
    form, in place; the token embedding stays as loaded."""
    if scheme == "none":
        return model
    if scheme not in _LAYERS:
        raise ValueError(f"quantization {scheme!r} is not one of {['none', *_LAYERS]}")
    if device.type != "cpu":
        raise ValueError(f"--quantization {scheme} uses CPU kernels; on {device.type} use "
                         "--quantization none")
    layer_cls = _LAYERS[scheme]
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, layer_cls(child))
    return model
