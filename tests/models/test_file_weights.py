"""`--quantization auto` (the default): weights as the file gives them. GGUF block
types through csrc/block_linear.cpp with the file's own blocks, bfloat16 weights
through csrc/bf16_linear.cpp; each kernel against a float64 definition, a token's
numbers independent of its batch, and the default model as served against float32."""

import copy

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from torch import nn

from amity.config import EngineConfig
from amity.engine.llm_engine import LLMEngine
from amity.engine.sampling_params import SamplingParams
from amity.models.cpu_kernels import cpu_has_amx_bf16, load_cpu_kernels
from amity.models.gguf_dequant import dequantize
from amity.models.gguf_loader import open_gguf
from amity.models.loader import default_model_path, load_model
from amity.models.quantization import Bf16Linear, BlockLinear, PackedLinear, file_blocks, quantize_model
from tests.models.test_parity import engine_logits

ZERO_POINT = {"Q4_0": 8, "Q4_1": 0, "Q8_0": 0}  # the file's q minus this is the weight's integer


def _linear(weight: torch.Tensor, bias: bool = True) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias:
            linear.bias.normal_()
    return linear


def _block_definition(x: torch.Tensor, kind: str, rows: torch.Tensor) -> torch.Tensor:
    """x [T, K] times a GGUF matrix's raw blocks, in float64: x quantized to int8 per
    token and block of 32 (dx = max|x| / 127, qx = round(x / dx)), and per block
    d dx sum((q - zero) qx), plus m dx sum(qx) for Q4_1. q, d and m are read from the
    file's bytes here by ggml's struct layouts, independently of file_blocks."""
    n = rows.shape[0]
    size = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[kind]
    raw = rows.numpy().reshape(n, -1, size)
    d = torch.from_numpy(raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64))
    if kind == "Q8_0":
        q = torch.from_numpy(raw[..., 2:].copy().view(np.int8).astype(np.float64))
    else:
        nibbles = raw[..., 4:] if kind == "Q4_1" else raw[..., 2:]
        q = torch.from_numpy(np.concatenate([nibbles & 15, nibbles >> 4], -1).astype(np.float64)) - ZERO_POINT[kind]
    blocks = x.float().reshape(x.shape[0], -1, 32)
    dx = blocks.abs().amax(-1) / 127
    qx = torch.round(blocks * torch.where(dx != 0, 1 / dx, torch.zeros_like(dx))[..., None]).double()
    out = torch.einsum("tbk,nbk,nb,tb->tn", qx, q, d, dx.double())
    if kind == "Q4_1":
        m = torch.from_numpy(raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64))
        out += torch.einsum("nb,tb->tn", m, dx.double() * qx.sum(-1))
    return out


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_block_linear_is_its_definition_and_batch_invariant(kind):
    load_cpu_kernels()
    torch.manual_seed(0)
    out_features, in_features = 51, 320  # two panels, the second padded; ten blocks
    weight = torch.randn(out_features, in_features) * 0.05
    qtype = GGMLQuantizationType[kind]
    rows = torch.from_numpy(quants.quantize(weight.numpy(), qtype))  # the bytes a GGUF file would hold
    linear = _linear(weight)
    layer = BlockLinear(linear, kind, *file_blocks(kind, rows))
    dequantized = dequantize(rows.numpy(), qtype, (out_features, in_features))
    for num_tokens in (1, 2, 5, 8, 9, 30):  # tiles of 8 tokens, and their tails
        x = torch.randn(num_tokens, in_features)
        x[0, 40:64] *= 50  # one loud block must not change the quantization of the others
        for dtype in (torch.float32, torch.bfloat16):
            x = x.to(dtype)
            got = layer(x)
            assert got.dtype == dtype and got.shape == (num_tokens, out_features)
            expected = _block_definition(x, kind, rows) + linear.bias.double()
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(got.double(), expected, rtol=tol, atol=tol)
            for i in range(num_tokens):  # a token's numbers do not depend on its batch
                assert torch.equal(layer(x[i:i + 1]), got[i:i + 1]), (num_tokens, i)
        # Against the file's weights with float activations, the int8 ones cost about 1%.
        exact = x.double() @ dequantized.double().t() + linear.bias.double()
        assert (got.double() - exact).abs().max() < 0.03 * exact.abs().max()
    layer = BlockLinear(_linear(weight, bias=False), kind, *file_blocks(kind, rows))
    x = torch.randn(40, in_features)
    assert layer.bias is None and torch.equal(layer(x)[17:18], layer(x[17:18]))


def _unpack_blocks(layer: BlockLinear, kind: str, out_features: int) -> torch.Tensor:
    """The kernel's panels back to the file's bytes: [out, blocks x block size] uint8."""
    packed = layer.weight_packed  # [panel, block, bytes]
    panels, num_blocks = packed.shape[:2]
    quad_bytes = 128 if kind == "Q8_0" else 64
    quads = packed[..., :8 * quad_bytes].reshape(panels, num_blocks, 8, -1, 4)  # [panel, block, quad, lane, 4]
    if kind == "Q8_0":
        q = quads.permute(0, 3, 1, 2, 4) ^ 0x80  # [panel, output, block, quad, 4]
    else:
        q = torch.cat([quads & 15, quads >> 4], dim=3).permute(0, 3, 1, 2, 4)
    q = q.reshape(panels * 32, num_blocks, 32)[:out_features]

    def scales(at: int) -> torch.Tensor:  # [panel, block, 32 x 2 bytes] -> [out, block, 2]
        return packed[..., at:at + 64].reshape(panels, num_blocks, 32, 2).permute(0, 2, 1, 3).reshape(
            panels * 32, num_blocks, 2)[:out_features]

    at = 8 * quad_bytes
    if kind == "Q8_0":
        return torch.cat([scales(at), q], -1).reshape(out_features, -1)
    nibbles = q[..., :16] | (q[..., 16:] << 4)
    head = [scales(at), scales(at + 64)] if kind == "Q4_1" else [scales(at)]
    return torch.cat([*head, nibbles], -1).reshape(out_features, -1)


@pytest.fixture(scope="module")
def default_model():
    return load_model(None, torch.float32, torch.device("cpu"))


@pytest.mark.slow
def test_default_model_runs_on_its_files_blocks_byte_for_byte(default_model):
    load_cpu_kernels()
    model = quantize_model(copy.deepcopy(default_model.model), "auto", torch.device("cpu"),
                           default_model.file_weights)
    reader = open_gguf(default_model_path())
    raw = {t.name: torch.from_numpy(np.array(t.data)) for t in reader.tensors}
    layer0 = model.model.layers[0]
    # Every linear layer is a block kernel, the tied LM head reads the embedding's Q8_0.
    assert all(isinstance(m, BlockLinear) for m in model.modules() if hasattr(m, "kernel"))
    checks = [(model.lm_head, "Q8_0", raw["token_embd.weight"]),
              (layer0.mlp.down_proj, "Q4_1", raw["blk.0.ffn_down.weight"]),
              (layer0.mlp.gate_up_proj, "Q4_1", torch.cat([raw["blk.0.ffn_gate.weight"], raw["blk.0.ffn_up.weight"]])),
              (model.model.layers[29].self_attn.o_proj, "Q4_1", raw["blk.29.attn_output.weight"])]
    for layer, kind, expected in checks:
        assert torch.equal(_unpack_blocks(layer, kind, expected.shape[0]), expected)
    # q and k rows are permuted in a llama GGUF: their blocks move with their rows.
    from amity.models.gguf_loader import _unpermute
    qkv = torch.cat([_unpermute(raw["blk.0.attn_q.weight"], 9), _unpermute(raw["blk.0.attn_k.weight"], 3),
                     raw["blk.0.attn_v.weight"]])
    assert torch.equal(_unpack_blocks(layer0.self_attn.qkv_proj, "Q4_1", qkv.shape[0]), qkv)


AMX = pytest.mark.skipif(not cpu_has_amx_bf16(), reason="this CPU has no AMX-BF16")


@pytest.mark.parametrize("tiles", [False, pytest.param(True, marks=AMX)], ids=["vdpbf16ps", "amx"])
@pytest.mark.parametrize("in_features", [300, 33])
def test_bf16_linear_is_its_definition_and_batch_invariant(in_features, tiles):
    load_cpu_kernels()
    torch.manual_seed(0)
    out_features = 51
    linear = _linear(torch.randn(out_features, in_features) * 0.05)
    layer = Bf16Linear(linear, tiles=tiles)
    weight = linear.weight.detach().bfloat16().double()
    # vdpbf16ps: 1-12 tokens take the direct tiles, 13+ the blocked ones (blocks of 128
    # pairs: 300 inputs end in a tail). AMX: tiles of 16 tokens, tasks of 32, steps of 16
    # pairs (150 pairs end in a tail).
    for num_tokens in (1, 2, 3, 5, 7, 12, 13, 16, 17, 30, 33):
        x = torch.randn(num_tokens, in_features)
        got = layer(x)
        assert got.dtype == torch.float32 and got.shape == (num_tokens, out_features)
        # Activations rounded to bfloat16, products exact, sums in float32.
        expected = x.bfloat16().double() @ weight.t() + linear.bias.double()
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
        for i in range(num_tokens):
            assert torch.equal(layer(x[i:i + 1]), got[i:i + 1]), (num_tokens, i)
    assert layer(x.bfloat16()).dtype == torch.bfloat16


def test_auto_keeps_each_checkpoints_precision(tiny_model_factory, tmp_path):
    import transformers

    path = tiny_model_factory("llama")
    float32 = load_model(path, torch.float32, torch.device("cpu"))
    model = quantize_model(float32.model, "auto", torch.device("cpu"), float32.file_weights)
    assert isinstance(model.lm_head, PackedLinear) and model.lm_head.weight_packed.dtype == torch.float32
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16)
    hf.save_pretrained(str(tmp_path))
    for f in path.iterdir():
        if not f.name.startswith(("model", "config")):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    bfloat16 = load_model(tmp_path, torch.float32, torch.device("cpu"))
    model = quantize_model(bfloat16.model, "auto", torch.device("cpu"), bfloat16.file_weights)
    bf16_layers = (Bf16Linear, PackedLinear)  # vdpbf16ps where the CPU has it, else bf16 weights x float32
    assert all(isinstance(m, bf16_layers) for m in model.modules() if hasattr(m, "kernel"))
    packed = model.model.layers[0].mlp.down_proj
    assert packed.weight_packed.dtype == torch.bfloat16
    # Without the loader's formats (a model built in code), auto is the float path.
    assert isinstance(quantize_model(nn.Sequential(nn.Linear(64, 32)), "auto", torch.device("cpu"))[0], PackedLinear)


def test_an_explicit_float32_dtype_is_the_reference_path():
    from amity.models.quantization import resolve_scheme

    assert resolve_scheme("auto", "float32") == "none"
    assert resolve_scheme("auto", "auto") == "auto" and resolve_scheme("int4", "float32") == "int4"


def test_the_kv_cache_keeps_the_weights_precision(default_model):
    # --kv-cache-dtype auto: the default model's file blocks keep K/V in int8, the
    # float32 reference path (--dtype float32) in float32.
    blocks = LLMEngine(EngineConfig(kv_cache_memory="16MiB", num_threads=1), copy.deepcopy(default_model))
    exact = LLMEngine(EngineConfig(dtype="float32", kv_cache_memory="16MiB", num_threads=1),
                      copy.deepcopy(default_model))
    assert (blocks.kv_cache.dtype, exact.kv_cache.dtype) == (torch.int8, torch.float32)


# benchmarks/README.md, session 7, over three 700-token texts: auto (the file's Q4_1 and
# Q8_0) KL 0.0029-0.0035, argmax 96.6-97.9%; bf16 KL 0.00014-0.00018, 99.3-99.4%.
# On this shorter text the bounds leave room; a broken kernel or packing falls far below.
@pytest.mark.parametrize("scheme, max_kl, min_top1", [("auto", 0.02, 0.85), ("bf16", 0.002, 0.95),
                                                      pytest.param("bf16-amx", 0.002, 0.95, marks=AMX)])
def test_default_schemes_stay_close_to_float32(default_model, scheme, max_kl, min_top1):
    text = ("The Roman Empire was the post-Republican state of ancient Rome. It is generally "
            "understood to mean the period and territory ruled by the Romans following "
            "Octavian's assumption of sole rule under the Principate in 27 BC. It included "
            "territory in Europe, North Africa, and Western Asia, and was ruled by emperors.")
    ids = default_model.tokenizer.encode(text)
    reference = engine_logits(LLMEngine(EngineConfig(dtype="float32", kv_cache_memory="64MiB", num_threads=1),
                                        copy.deepcopy(default_model)), ids).log_softmax(-1)
    engine = LLMEngine(EngineConfig(kv_cache_memory="64MiB", num_threads=1, quantization=scheme), copy.deepcopy(default_model))
    logprobs = engine_logits(engine, ids).log_softmax(-1)
    kl = (reference.exp() * (reference - logprobs)).sum(-1).mean().item()
    top1 = (reference.argmax(-1) == logprobs.argmax(-1)).float().mean().item()
    assert kl < max_kl and top1 > min_top1, (kl, top1)


@pytest.mark.parametrize("scheme", ["auto", "bf16"])
def test_default_model_greedy_tokens_do_not_depend_on_the_batch(default_model, scheme):
    # The engine as it ships (every default but the KV budget): each prompt alone,
    # all together, and in another order gives the same tokens. The linear kernels
    # are bitwise batch-invariant (above); torch's own reductions around them (the
    # norms) may split a row's sum differently for another number of rows, so the
    # logprobs are compared to 1e-4, as test_quantization's engine test does.
    engine = LLMEngine(EngineConfig(kv_cache_memory="64MiB", num_threads=1, quantization=scheme), copy.deepcopy(default_model))
    params = SamplingParams(temperature=0.0, max_tokens=16, eos_token=[], logprobs=0)
    prompts = [default_model.tokenizer.encode(p) for p in
               ("The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village near the sea,")]
    alone = [engine.generate([p], params)[0].ordered_choices[0] for p in prompts]
    together = [o.ordered_choices[0] for o in engine.generate(prompts, params)]
    engine.kv.pool.reset_prefix_cache()
    staggered = [o.ordered_choices[0] for o in engine.generate(prompts[::-1], params)][::-1]
    for a, b, c in zip(alone, together, staggered):
        assert a.token_ids == b.token_ids == c.token_ids
        for other in (b, c):
            torch.testing.assert_close([lp.logprob for lp in a.logprobs], [lp.logprob for lp in other.logprobs],
                                       rtol=0, atol=1e-4)


def test_default_model_answers_the_same_from_the_prefix_cache_and_in_chunks(default_model):
    # The engine as it ships: a 64-token prompt that misses the prefix cache, the same
    # prompt hitting it (only its last partial block computed), and the prompt prefilled
    # 24 tokens a step give the same tokens and logprobs, bit for bit. Attention computes
    # each row alone (csrc/paged_attention.cpp) and the linear kernels are batch-
    # invariant; with prefills on ATen's SDPA, as before session 19, a hit moved these
    # logprobs by up to 0.2 and the chunked prefill changed the greedy tokens.
    text = ("The Roman Empire was the state ruled by the Romans following Octavian's assumption of sole rule "
            "under the Principate in 27 BC. It included territory in Europe, North Africa, and Western Asia, "
            "and was ruled by emperors. The fall of the Western Roman Empire in 476 AD marks the end of")
    ids = default_model.tokenizer.encode(text)
    params = SamplingParams(temperature=0.0, max_tokens=12, eos_token=[], logprobs=0)

    def answer(engine):
        (out,) = engine.generate([ids], params)
        choice = out.ordered_choices[0]
        return out.num_cached_tokens, choice.token_ids, [lp.logprob for lp in choice.logprobs]

    engine = LLMEngine(EngineConfig(kv_cache_memory="64MiB", num_threads=1), copy.deepcopy(default_model))
    cached, *missed = answer(engine)
    assert cached == 0
    cached, *hit = answer(engine)
    assert 0 < cached < len(ids) and hit == missed
    chunked = LLMEngine(EngineConfig(kv_cache_memory="64MiB", num_threads=1, max_num_batched_tokens=24,
                                     enable_prefix_caching=False), copy.deepcopy(default_model))
    _, *chunked_answer = answer(chunked)
    assert chunked_answer == missed
