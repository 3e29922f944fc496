"""Quantized linear layers: each kernel against its own definition, an engine that
runs them, and their accuracy on the default model against the float32 path."""

import copy

import pytest
import torch
from torch import nn

from amity.config import EngineConfig
from amity.engine.llm_engine import LLMEngine
from amity.engine.sampling_params import SamplingParams
from amity.models.loader import load_model
from amity.models.cpu_kernels import cpu_has, cpu_has_amx_bf16, load_cpu_kernels
from amity.models.quantization import (BlockLinear, Int8Linear, PackedLinear, q4_1_blocks, q4_1_linear,
                                      quantize_model)
from tests.models.test_parity import engine_logits


def _linear(out_features: int, in_features: int, weight: torch.Tensor, bias: bool = True):
    linear = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(weight)
    return linear


def test_int8_is_int8_weights_times_per_token_int8_activations():
    torch.manual_seed(0)
    weight = torch.randn(48, 64) * 0.05
    linear = _linear(48, 64, weight)
    layer = Int8Linear(linear)
    x = torch.randn(5, 64)
    x[2] *= 100  # one loud token must not change the quantization of the others
    # The definition, written out: symmetric int8, a scale per output row and per token.
    w_scale = weight.abs().amax(1) / 127
    w_q = torch.round(weight / w_scale[:, None])
    x_scale = x.abs().amax(1, keepdim=True) / 127
    x_q = torch.round(x / x_scale)
    expected = (x_q @ w_q.t()) * x_scale * w_scale + linear.bias
    got = layer(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert (layer.weight_t.abs() <= 127).all() and layer.weight_t.dtype == torch.int8
    # Each token's row is its own: the same token alone gives the same numbers, bit for bit.
    for i in range(5):
        assert torch.equal(layer(x[i:i + 1]), got[i:i + 1])
    assert (got - linear(x)).abs().max() < 0.05 * linear(x).abs().max()


# 1-12 tokens take the direct tiles (1-4 panels at once), 13+ the blocked ones
# (12-token tiles over widened blocks of 128 k, and a tail); 51 rows pad to two
# panels, and 300 inputs make a blocked tail of 44.
PACKED_TOKENS = (1, 2, 3, 5, 7, 12, 13, 30)


@pytest.mark.parametrize("weights", ["int8", "float32", "bfloat16", "float32 as bfloat16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_is_its_definition_and_batch_invariant(weights, dtype):
    load_cpu_kernels()
    torch.manual_seed(0)
    out_features, in_features = 51, 300
    weight = torch.randn(out_features, in_features) * 0.05
    if weights == "int8":
        linear = _linear(out_features, in_features, weight)
        layer = PackedLinear(linear, "int8")
        w_scale = weight.abs().amax(1) / 127
        w_q = torch.round(weight / w_scale[:, None])
        effective = w_q.double() * w_scale.double()[:, None]
        assert layer.weight_packed.dtype == torch.int8
        assert torch.equal(layer.weight_packed.transpose(1, 2).reshape(-1, in_features)[:out_features].double(),
                           w_q.double())
    elif weights == "float32 as bfloat16":  # bf16-weight: rounded once, at packing
        linear = _linear(out_features, in_features, weight)
        layer = PackedLinear(linear, "bfloat16")
        effective = weight.bfloat16().double()
        assert layer.weight_packed.dtype == torch.bfloat16 and layer.weight_scale is None
    else:
        linear = _linear(out_features, in_features, weight).to(getattr(torch, weights))
        layer = PackedLinear(linear, "loaded")
        effective = linear.weight.double()
        assert layer.weight_packed.dtype == getattr(torch, weights) and layer.weight_scale is None
    bias = linear.bias.double()
    for num_tokens in PACKED_TOKENS:
        x = torch.randn(num_tokens, in_features).to(dtype)
        expected = x.double() @ effective.t() + bias
        got = layer(x)
        assert got.dtype == dtype and got.shape == (num_tokens, out_features)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.double(), expected, rtol=tol, atol=tol)
        # A token's numbers do not depend on its batch: alone, bit for bit the same.
        for i in range(num_tokens):
            assert torch.equal(layer(x[i:i + 1]), got[i:i + 1]), (num_tokens, i)
    # Without a bias.
    layer = PackedLinear(_linear(64, 32, torch.randn(64, 32), bias=False), "int8" if weights == "int8" else "loaded")
    x = torch.randn(40, 32)
    assert torch.equal(layer(x)[17:18], layer(x[17:18]))


def _q4_1_definition(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """x [T, K] times Q4_1 weights (q [N, K], d and m [N, K / 32]), in float64, with
    x quantized to int8 per token and block of 32 as llama.cpp's Q8_1: qx =
    round(x * (1 / dx)), dx = max|x| / 127, and the offsets times dx * sum(qx)."""
    blocks = x.float().reshape(x.shape[0], -1, 32)
    dx = blocks.abs().amax(-1) / 127
    qx = torch.round(blocks * torch.where(dx != 0, 1 / dx, torch.zeros_like(dx))[..., None])
    int_sums = torch.einsum("tbk,nbk->tnb", qx.double(), q.double().reshape(q.shape[0], -1, 32))
    offsets = (dx * qx.sum(-1)).double()
    return ((int_sums * d.double()[None] * dx.double()[:, None]).sum(-1)
            + (m.double()[None] * offsets[:, None]).sum(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_q4_1_linear_is_its_definition_and_batch_invariant(dtype):
    load_cpu_kernels()
    torch.manual_seed(0)
    out_features, in_features = 51, 320  # two panels, the second padded; ten blocks
    linear = _linear(out_features, in_features, torch.randn(out_features, in_features) * 0.05)
    layer = q4_1_linear(linear)
    q, d, m = q4_1_blocks(linear.weight.detach())
    assert layer.weight_packed.shape == (2, 10, 640) and q.max() == 15 and q.min() == 0
    dequantized = (q.reshape(out_features, -1, 32) * d.float()[..., None] + m.float()[..., None]).reshape_as(q)
    assert (dequantized - linear.weight).abs().max() <= (d.float().max() / 2) * 1.01  # half a step
    for num_tokens in (1, 2, 5, 8, 9, 30):  # tiles of 8 tokens, and their tails
        x = torch.randn(num_tokens, in_features).to(dtype)
        x[0, 40:64] *= 50  # one loud block must not change the quantization of the others
        got = layer(x)
        assert got.dtype == dtype and got.shape == (num_tokens, out_features)
        expected = _q4_1_definition(x, q, d, m) + linear.bias.double()
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.double(), expected, rtol=tol, atol=tol)
        for i in range(num_tokens):
            assert torch.equal(layer(x[i:i + 1]), got[i:i + 1]), (num_tokens, i)
        # Against the same weights with float activations, the int8 ones cost about 1%.
        exact = x.double() @ dequantized.double().t() + linear.bias.double()
        assert (got.double() - exact).abs().max() < 0.03 * exact.abs().max()
    # Without a bias.
    layer = q4_1_linear(_linear(64, 32, torch.randn(64, 32), bias=False))
    x = torch.randn(40, 32)
    assert layer.bias is None and torch.equal(layer(x)[17:18], layer(x[17:18]))


def test_q4_1_blocks_are_the_default_models_own():
    # Dequantized on load and quantized again at start-up, every Q4_1 tensor of the
    # default model comes back as the file's blocks, bit for bit: `int4` computes
    # with the file's weights.
    from gguf import GGMLQuantizationType
    from amity.models.gguf_dequant import dequantize
    from amity.models.gguf_loader import open_gguf
    from amity.models.loader import default_model_path

    reader = open_gguf(default_model_path())
    checked = 0
    for tensor in reader.tensors:
        if tensor.tensor_type != GGMLQuantizationType.Q4_1 or not tensor.name.startswith(("blk.0.", "blk.29.")):
            continue
        shape = tuple(reversed(tensor.shape))
        raw = torch.from_numpy(tensor.data.copy()).view(torch.uint8).reshape(-1, 20)
        q, d, m = q4_1_blocks(dequantize(tensor.data, tensor.tensor_type, shape))
        assert torch.equal(d.reshape(-1).view(torch.uint8), raw[:, :2].reshape(-1)), tensor.name
        assert torch.equal(m.reshape(-1).view(torch.uint8), raw[:, 2:4].reshape(-1)), tensor.name
        nibbles = torch.cat([raw[:, 4:] & 15, raw[:, 4:] >> 4], dim=1)  # element j low, j + 16 high
        assert torch.equal(q.reshape(-1, 32), nibbles), tensor.name
        checked += 1
    assert checked == 14


def test_int4_refuses_inputs_that_do_not_fill_blocks():
    with pytest.raises(ValueError, match="divisible by 32"):
        q4_1_linear(nn.Linear(40, 8))


def test_quantize_model_replaces_every_linear_but_keeps_the_tied_embedding(tiny_model_factory):
    loaded = load_model(tiny_model_factory("smollm2"), torch.float32, torch.device("cpu"))
    embedding = loaded.model.model.embed_tokens.weight.detach().clone()
    assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight  # tied
    unquantized = copy.deepcopy(loaded.model)
    unquantized_int4 = copy.deepcopy(loaded.model)
    quantize_model(loaded.model, "int8", torch.device("cpu"))
    assert not any(isinstance(m, nn.Linear) for m in loaded.model.modules())
    assert isinstance(loaded.model.lm_head, Int8Linear)
    assert torch.equal(loaded.model.model.embed_tokens.weight, embedding)
    assert quantize_model(loaded.model, "int8", torch.device("cpu")) is loaded.model  # again: as it is
    with pytest.raises(ValueError, match="already 'int8'"):
        quantize_model(loaded.model, "int8-weight", torch.device("cpu"))
    # `none` on the CPU is the packed float kernel, and on a GPU the nn.Linears as loaded.
    assert quantize_model(copy.deepcopy(unquantized), "none", torch.device("cuda")).lm_head.__class__ is nn.Linear
    quantize_model(unquantized, "none", torch.device("cpu"))
    assert isinstance(unquantized.lm_head, PackedLinear) and unquantized.lm_head.weight_scale is None
    with pytest.raises(ValueError, match="CPU kernels"):
        quantize_model(loaded.model, "int4", torch.device("cuda"))
    # int4 keeps the LM head at 8 bits, as Q4_1 files keep their output matrix.
    int4 = quantize_model(unquantized_int4, "int4", torch.device("cpu"))
    assert isinstance(int4.model.layers[0].mlp.down_proj, BlockLinear)
    assert isinstance(int4.lm_head, PackedLinear) and int4.lm_head.weight_packed.dtype == torch.int8
    with pytest.raises(ValueError, match="not one of"):
        quantize_model(loaded.model, "fp8", torch.device("cpu"))


BF16_AMX = pytest.param("bf16-amx", marks=pytest.mark.skipif(not cpu_has_amx_bf16(), reason="no AMX-BF16"))


@pytest.mark.parametrize("scheme", ["none", "bf16", BF16_AMX, "bf16-weight", "int8", "int8-weight", "int4"])
def test_quantized_engine_batches_like_it_runs_alone(tiny_model_factory, scheme):
    path = tiny_model_factory("llama")
    engine = LLMEngine(EngineConfig(model=str(path), dtype="float32", kv_cache_memory="16MiB",
                                    block_size=8, quantization=scheme, num_threads=1))
    params = SamplingParams(temperature=0.0, max_tokens=12, eos_token=[], logprobs=0)
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]]
    alone = [engine.generate([p], params)[0].ordered_choices[0] for p in prompts]
    together = [o.ordered_choices[0] for o in engine.generate(prompts, params)]
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close([lp.logprob for lp in a.logprobs],
                                   [lp.logprob for lp in b.logprobs], rtol=0, atol=1e-4)


@pytest.fixture(scope="module")
def default_model():
    return load_model(None, torch.float32, torch.device("cpu"))


# Measured on 700-token texts (benchmarks/README.md has the figures): int8 keeps the
# float32 argmax at ~89% of positions (KL ~0.03), int8-weight at ~96% (KL ~0.005),
# int4 at ~96% (KL ~0.004), bf16-weight at ~99.7% (KL ~0.0001). A broken kernel or
# packing falls to a few percent.
@pytest.mark.parametrize("scheme", ["bf16-weight", "int8", "int8-weight", "int4"])
def test_quantized_default_model_stays_close_to_float32(default_model, scheme):
    text = ("The Roman Empire was the post-Republican state of ancient Rome. It is generally "
            "understood to mean the period and territory ruled by the Romans following "
            "Octavian's assumption of sole rule under the Principate in 27 BC. It included "
            "territory in Europe, North Africa, and Western Asia, and was ruled by emperors.")
    ids = default_model.tokenizer.encode(text)
    config = EngineConfig(dtype="float32", kv_cache_memory="64MiB")
    reference = engine_logits(LLMEngine(config, copy.deepcopy(default_model)), ids).log_softmax(-1)
    quantized = copy.deepcopy(default_model)
    engine = LLMEngine(EngineConfig(dtype="float32", kv_cache_memory="64MiB",
                                    quantization=scheme), quantized)
    logprobs = engine_logits(engine, ids).log_softmax(-1)
    kl = (reference.exp() * (reference - logprobs)).sum(-1).mean().item()
    top1 = (reference.argmax(-1) == logprobs.argmax(-1)).float().mean().item()
    assert kl < 0.12 and top1 > 0.75, (kl, top1)


@pytest.mark.parametrize("scheme", ["auto", "none", "bf16", BF16_AMX, "bf16-weight", "int8", "int8-weight", "int4"])
def test_every_layer_takes_a_batch_of_no_rows(scheme):
    # A step whose only sequence is mid-prefill samples nothing: its LM head gets 0 rows.
    load_cpu_kernels()
    model = nn.Sequential(nn.Linear(64, 48))
    layer = quantize_model(model, scheme, torch.device("cpu"))[0]
    assert layer(torch.randn(0, 64)).shape == (0, 48)
    assert layer(torch.randn(2, 0, 64)).shape == (2, 0, 48)


def test_bf16_amx_is_refused_on_a_cpu_without_amx(monkeypatch):
    import amity.models.quantization as quantization

    monkeypatch.setattr(quantization, "cpu_has_amx_bf16", lambda: False)
    with pytest.raises(ValueError, match="needs a CPU with AMX"):
        quantize_model(nn.Sequential(nn.Linear(64, 32)), "bf16-amx", torch.device("cpu"))


AMX = pytest.mark.skipif(not cpu_has_amx_bf16(), reason="no AMX-BF16")


def _block_layer(kind: str, out_features: int, in_features: int) -> tuple[BlockLinear, nn.Linear]:
    """A block layer of `kind` and an nn.Linear of exactly its weights, rounded to
    bfloat16 as the tiles compute with them: d (q - zero) (+ m), one float32 rounding."""
    linear = _linear(out_features, in_features, torch.randn(out_features, in_features) * 0.05)
    if kind == "Q4_1":
        q, d, m = q4_1_blocks(linear.weight.detach())
    else:  # the file's stored q: Q4_0's 0-15 (zero 8), Q8_0's q + 128
        q = torch.randint(0, 16 if kind == "Q4_0" else 256, (out_features, in_features), dtype=torch.uint8)
        d, m = (torch.rand(out_features, in_features // 32) * 0.01 + 1e-4).half(), None
    zero = {"Q4_0": 8, "Q4_1": 0, "Q8_0": 128}[kind]
    weight = d.float().repeat_interleave(32, 1) * (q.float() - zero)
    if m is not None:
        weight = weight + m.float().repeat_interleave(32, 1)
    dequantized = _linear(out_features, in_features, weight.bfloat16().float())
    with torch.no_grad():
        dequantized.bias.copy_(linear.bias)
    return BlockLinear(linear, kind, q, d, m), dequantized


@pytest.mark.skipif(not (cpu_has("amx_tile") and cpu_has("amx_int8")), reason="no AMX-INT8")
@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_int8_tiles_give_a_batch_the_bits_of_its_rows_alone(kind):
    # From 16 rows up the integer sums run on AMX's int8 tiles (groups of 32, then
    # 16, the rest on VNNI), a row alone on VNNI: the float steps are shared.
    load_cpu_kernels()
    torch.manual_seed(0)
    layer, _ = _block_layer(kind, 70, 192)
    for num_tokens in (16, 17, 31, 32, 33, 48, 100):
        x = torch.randn(num_tokens, 192) * 3
        x[1, 64:96] *= 50
        got = layer(x)
        alone = torch.cat([layer(x[i:i + 1]) for i in range(num_tokens)])
        assert torch.equal(got, alone), num_tokens


@AMX
@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_prompt_rows_are_bf16_tiles_of_the_dequantized_weights_and_batch_invariant(kind):
    from amity.models.prompt_rows import PromptRows
    from amity.models.quantization import Bf16Linear

    load_cpu_kernels()
    torch.manual_seed(0)
    layer, dequantized = _block_layer(kind, 70, 96)
    tiles = Bf16Linear(dequantized, tiles=True)
    rows = PromptRows(capacity=4)  # grows for the 600-token step below
    layer.prompt_rows = rows
    # 1-16 tokens: one tile of tokens, the panel a step at a time; 17-32: two; more:
    # the panel dequantized once per task of up to 512 tokens, 32 tokens a pass.
    # Rows on tiles at random (many runs), a tiles row, block rows, then tiles rows
    # (three runs), and runs of a few rows (four to six): up to four runs are each
    # computed in place, more are gathered.
    steps = [(n, on_tiles) for n in (1, 5, 16, 17, 33, 40, 600)
             for on_tiles in (torch.rand(n) < 0.5, torch.arange(n) >= n // 3,
                              torch.arange(n) % max(1, n // 2) >= n // 5)]
    for num_tokens, on_tiles in steps:
        x = torch.randn(num_tokens, 96)
        on_tiles[0] = True
        rows.set_step(on_tiles)
        got = layer(x)
        want_tiles = tiles(x)
        layer.prompt_rows = None
        want_blocks = layer(x)
        layer.prompt_rows = rows
        assert torch.equal(got[on_tiles], want_tiles[on_tiles]), num_tokens
        assert torch.equal(got[~on_tiles], want_blocks[~on_tiles]), num_tokens
        assert not torch.equal(want_tiles[0], want_blocks[0])  # two paths, two roundings
        for i in range(0, num_tokens, max(1, num_tokens // 7)):
            rows.set_step(on_tiles[i:i + 1])
            assert torch.equal(layer(x[i:i + 1]), got[i:i + 1]), (num_tokens, i)
    rows.set_step(torch.ones(1, dtype=torch.bool))
    assert layer(torch.randn(0, 96)).shape == (0, 70)


@AMX
def test_prompt_tiles_change_nothing_by_batch_chunk_cache_or_preemption(tiny_model_factory):
    from amity.engine.request import RequestStatus
    from amity.models.prompt_rows import find_prompt_rows

    path = tiny_model_factory("llama")

    def engine(**overrides) -> LLMEngine:
        config = dict(model=str(path), dtype="float32", kv_cache_memory="16MiB", block_size=4,
                      quantization="int4", prompt_tiles="auto", num_threads=1) | overrides
        return LLMEngine(EngineConfig(**config))

    reference = engine(enable_prefix_caching=False)
    assert find_prompt_rows(reference.model) is not None
    assert find_prompt_rows(engine(prompt_tiles="off", enable_prefix_caching=False).model) is None
    params = SamplingParams(temperature=0.0, max_tokens=12, eos_token=[], logprobs=0)
    prompts = [[5, 6, 7, 8, 9], [10, 11], list(range(12, 41)), list(range(50, 63))]

    def alone(prompt):
        return reference.generate([prompt], params)[0].ordered_choices[0]

    def tokens(outputs):
        return [o.ordered_choices[0].token_ids for o in outputs]

    expected = [alone(p).token_ids for p in prompts]
    # Batched, and prompts chunked across steps (8 tokens a step).
    assert tokens(engine(max_num_batched_tokens=8).generate(prompts, params)) == expected
    # A follow-up turn whose prompt holds the first answer: its blocks are computed
    # again as prompt, never taken from the first request's generated ones.
    cached = engine()
    first = cached.generate([prompts[2]], params)[0].ordered_choices[0]
    follow_up = prompts[2] + first.token_ids + [7, 8, 9]
    (out,) = cached.generate([follow_up], params)
    assert out.num_cached_tokens == len(prompts[2]) // 4 * 4
    assert out.ordered_choices[0].token_ids == alone(follow_up).token_ids
    # A pool too small for all four: preempted requests recompute their outputs on
    # the blocks' path, not the prompt's.
    block_bytes = reference.kv_cache.nbytes // reference.num_blocks
    small = engine(kv_cache_memory=str(14 * block_bytes), max_num_batched_tokens=16)  # 14 blocks
    preempted = set()
    for i, p in enumerate(prompts):
        small.add_request(f"r{i}", p, params)
    got = {f"r{i}": [] for i in range(len(prompts))}
    while small.has_unfinished_requests():
        for o in small.step():
            for c in o.outputs:
                got[o.request_id].extend(c.new_token_ids)
        preempted.update(r.request_id for r in small.scheduler.waiting if r.status is RequestStatus.PREEMPTED)
    assert small.num_blocks == 14 and preempted, "the pool is too small for all four: something must be preempted"
    assert [got[f"r{i}"] for i in range(len(prompts))] == expected


@AMX
def test_one_path_for_every_row_keeps_generated_blocks_reusable(tiny_model_factory):
    # A float32 checkpoint under --prompt-tiles: the mask reaches attention, but a
    # float32 cache (and a head_dim of 16) keeps every row on the float32 loops, so a
    # follow-up turn takes the first answer's blocks from the cache, as without tiles.
    from amity.models.prompt_rows import find_prompt_rows

    path = tiny_model_factory("llama")

    def engine(**overrides) -> LLMEngine:
        config = dict(model=str(path), dtype="float32", kv_cache_memory="16MiB", block_size=4,
                      prompt_tiles="auto", num_threads=1) | overrides
        return LLMEngine(EngineConfig(**config))

    cached = engine()
    assert find_prompt_rows(cached.model) is not None and not cached.kv.prompt_rows_differ
    assert engine(quantization="int4").kv.prompt_rows_differ  # its linear layers tile prompt rows
    params = SamplingParams(temperature=0.0, max_tokens=12, eos_token=[], logprobs=0)
    prompt = list(range(12, 41))
    first = cached.generate([prompt], params)[0].ordered_choices[0]
    follow_up = prompt + first.token_ids + [7, 8, 9]
    (out,) = cached.generate([follow_up], params)
    # The first turn's K/V: its prompt and every generated token but the last, 10 full blocks.
    assert out.num_cached_tokens == (len(prompt) + len(first.token_ids) - 1) // 4 * 4
    fresh = engine(enable_prefix_caching=False).generate([follow_up], params)[0].ordered_choices[0]
    assert out.ordered_choices[0].token_ids == fresh.token_ids


@pytest.mark.parametrize("scheme", ["none", "bf16", BF16_AMX, "int4"])
def test_any_number_of_threads_computes_every_panel_once(scheme):
    # Each thread streams its own run of panels and takes up the others' (PanelQueue,
    # csrc/panel_queue.h): whatever the team, every output is computed once, the same.
    load_cpu_kernels()
    torch.manual_seed(0)
    layer = quantize_model(nn.Sequential(nn.Linear(576, 1024)), scheme, torch.device("cpu"))[0]
    threads = torch.get_num_threads()
    try:
        for num_tokens in (1, 5, 32, 100):
            x = torch.randn(num_tokens, 576)
            torch.set_num_threads(1)
            expected = layer(x)
            for num_threads in (2, 3):
                torch.set_num_threads(num_threads)
                assert torch.equal(layer(x), expected), (num_tokens, num_threads)
    finally:
        torch.set_num_threads(threads)
