"""GGUF K-quants (Q4_K, Q6_K) through csrc/block_linear.cpp: the fields we unpack
define exactly gguf-py's weights, the kernel is its float64 definition, a token's
numbers do not depend on its batch, and a GGUF file of these types is served with
its own blocks under `--quantization auto`."""

import copy

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from torch import nn

from amity.models.cpu_kernels import load_cpu_kernels
from amity.models.k_quants import SUB_BLOCK, ZERO_POINT, k_quant_blocks, k_quant_weight
from amity.models.quantization import BLOCK_FORMATS, SuperBlockLinear, quantize_model
from tests.models.k_quant_writer import QUANTIZE
from tests.models.test_gguf import random_blocks, tiny_config, tiny_state_dict, write_gguf

KINDS = ["Q4_K", "Q6_K"]


def _linear(weight: torch.Tensor, bias: bool = True) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias:
            linear.bias.normal_()
    return linear


@pytest.mark.parametrize("kind", KINDS)
def test_fields_define_gguf_pys_weights_exactly(kind):
    qtype = GGMLQuantizationType[kind]
    raw = random_blocks(qtype, 6, 512, np.random.default_rng(int(qtype)))  # every bit pattern, finite scales
    expected = gguf.quants.dequantize(raw, qtype)
    ours = k_quant_weight(k_quant_blocks(kind, torch.from_numpy(raw)))
    np.testing.assert_array_equal(ours.numpy(), expected)
    # And the test writer's bytes are the format: its weights come back within a step.
    weight = np.random.default_rng(1).standard_normal((8, 512)).astype(np.float32) * 0.05
    written = QUANTIZE[kind](weight)
    assert written.shape == (8, 2 * gguf.GGML_QUANT_SIZES[qtype][1])
    back = gguf.quants.dequantize(written, qtype)
    assert np.abs(back - weight).max() < (0.1 if kind == "Q4_K" else 0.03) * np.abs(weight).max()


def _definition(x: torch.Tensor, kind: str, rows: torch.Tensor) -> torch.Tensor:
    """x [T, K] times the blocks, in float64: x quantized to int8 per token and block
    of 32 (dx = max|x| / 127, qx = round(x / dx)); per sub-block d sc dx sum((q -
    zero) qx), minus dmin m dx sum(qx) for Q4_K."""
    b = k_quant_blocks(kind, rows)
    sub, per_super = SUB_BLOCK[kind], 256 // SUB_BLOCK[kind]
    blocks = x.float().reshape(x.shape[0], -1, 32)
    dx = blocks.abs().amax(-1) / 127
    qx = torch.round(blocks * torch.where(dx != 0, 1 / dx, torch.zeros_like(dx))[..., None]).double()
    qx, dx = qx.reshape(x.shape[0], -1, sub), dx.double().repeat_interleave(32 // sub, dim=1)  # per sub-block
    q = b.q.double().reshape(b.q.shape[0], -1, sub) - ZERO_POINT[kind]
    sc = (b.sc.view(torch.int8) if kind == "Q6_K" else b.sc).double()
    scale = b.d.double().repeat_interleave(per_super, dim=1) * sc
    out = torch.einsum("tsk,nsk,ns,ts->tn", qx, q, scale, dx)
    if kind == "Q4_K":
        offset = b.dmin.double().repeat_interleave(per_super, dim=1) * b.m.double()
        out -= torch.einsum("ns,ts->tn", offset, dx * qx.sum(-1))
    return out


def _scaled_random_rows(kind: str, out_features: int, in_features: int, seed: int) -> torch.Tensor:
    """Random blocks (every q, sc and m pattern) with float16 d and dmin of a layer's size."""
    qtype = GGMLQuantizationType[kind]
    raw = random_blocks(qtype, out_features, in_features, np.random.default_rng(seed))
    blocks = raw.reshape(-1, gguf.GGML_QUANT_SIZES[qtype][1])
    for at in ([0, 2] if kind == "Q4_K" else [208]):
        scale = np.random.default_rng(seed + at).uniform(-0.01, 0.01, (blocks.shape[0], 1)).astype(np.float16)
        blocks[:, at:at + 2] = scale.view(np.uint8)
    return torch.from_numpy(raw)


@pytest.mark.parametrize("kind", KINDS)
def test_super_block_linear_is_its_definition_and_batch_invariant(kind):
    load_cpu_kernels()
    torch.manual_seed(0)
    out_features, in_features = 51, 512  # two panels, the second padded; two super-blocks
    rows = _scaled_random_rows(kind, out_features, in_features, seed=3)
    weight = k_quant_weight(k_quant_blocks(kind, rows))
    linear = _linear(weight)
    layer = SuperBlockLinear(linear, k_quant_blocks(kind, rows))
    for num_tokens in (1, 3, 8, 9, 17):  # tiles of 8 tokens, and their tails
        x = torch.randn(num_tokens, in_features)
        x[0, 40:64] *= 50  # one loud block must not change the quantization of the others
        for dtype in (torch.float32, torch.bfloat16):
            x = x.to(dtype)
            got = layer(x)
            assert got.dtype == dtype and got.shape == (num_tokens, out_features)
            expected = _definition(x, kind, rows) + linear.bias.double()
            # float32 steps (one per sub-block) against float64: 1e-5 of the outputs' scale.
            tol = (1e-5 if dtype == torch.float32 else 1e-2) * expected.abs().max().item()
            torch.testing.assert_close(got.double(), expected, rtol=0, atol=tol)
            for i in range(num_tokens):  # a token's numbers do not depend on its batch
                assert torch.equal(layer(x[i:i + 1]), got[i:i + 1]), (num_tokens, i)
        # Against the file's weights with float activations, the int8 ones cost about 1%.
        exact = x.double() @ weight.double().t() + linear.bias.double()
        assert (got.double() - exact).abs().max() < 0.03 * exact.abs().max()
    layer = SuperBlockLinear(_linear(weight, bias=False), k_quant_blocks(kind, rows))
    x = torch.randn(40, in_features)
    assert layer.bias is None and torch.equal(layer(x)[17:18], layer(x[17:18]))


def test_a_k_quant_gguf_is_served_with_its_own_blocks(tmp_path):
    # A tiny llama GGUF typed as llama.cpp's Q4_K_M mixes them: Q4_K, with Q6_K for
    # the down projections and the output matrix; every weight row a multiple of 256.
    from amity.models import gguf_loader
    from amity.models.loader import fill_weights, instantiate, model_class

    load_cpu_kernels()
    config = tiny_config("llama", hidden_size=256, intermediate_size=512)
    path = tmp_path / "tiny-q4_k_m.gguf"
    write_gguf(path, "llama", config, tiny_state_dict(config),
               lambda name: GGMLQuantizationType.Q6_K if ("ffn_down" in name or name == "output.weight")
               else GGMLQuantizationType.Q4_K,
               quantize=lambda a, qtype: QUANTIZE[qtype.name](a))
    config = gguf_loader.gguf_config(path)
    model = instantiate(model_class(config), config, torch.float32, torch.device("cpu"))
    fill_weights(model, gguf_loader.iter_gguf_weights(path), path)  # the float32 reference: the file dequantized
    served = quantize_model(copy.deepcopy(model), "auto", torch.device("cpu"), gguf_loader.gguf_file_weights(path))
    layer0, reference0 = served.model.layers[0], model.model.layers[0]
    # q and k rows are permuted in a llama GGUF: their blocks move with their rows.
    pairs = [(layer0.self_attn.qkv_proj, reference0.self_attn.qkv_proj, "Q4_K"),
             (layer0.self_attn.o_proj, reference0.self_attn.o_proj, "Q4_K"),
             (layer0.mlp.gate_up_proj, reference0.mlp.gate_up_proj, "Q4_K"),
             (layer0.mlp.down_proj, reference0.mlp.down_proj, "Q6_K"),
             (served.lm_head, model.lm_head, "Q6_K")]
    torch.manual_seed(0)
    for layer, reference, kind in pairs:
        assert isinstance(layer, SuperBlockLinear) and layer.format == BLOCK_FORMATS[kind]
        x = torch.randn(17, reference.weight.shape[1])
        got = layer(x)
        exact = reference(x).double()
        assert (got.double() - exact).abs().max() < 0.03 * exact.abs().max(), kind
        for batch in (1, 3):
            assert torch.equal(layer(x[:batch]), got[:batch])
