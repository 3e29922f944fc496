"""Read a llama.cpp GGUF checkpoint as a Hugging Face config plus HF-named weights.

GGUF keeps hyper-parameters as `{arch}.*` metadata keys and weights under llama.cpp's
names (`blk.N.attn_q.weight`), in one memory-mapped file. We translate both to the
`transformers` vocabulary so the rest of the engine sees one kind of checkpoint.
Each public function takes a path or an open `GgufFile` (gguf_reader.py).
"""

import functools
import math
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, PretrainedConfig, Qwen2Config, Qwen3Config

from amity.models.file_weights import FileWeight
from amity.models.gguf_dequant import dequantize
from amity.models.gguf_reader import GgufFile

_ARCHS: dict[str, tuple[type[PretrainedConfig], str]] = {
    "llama": (LlamaConfig, "LlamaForCausalLM"),
    "qwen2": (Qwen2Config, "Qwen2ForCausalLM"),
    "qwen3": (Qwen3Config, "Qwen3ForCausalLM"),
}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# Tensors with no HF parameter: llama3 rope frequency factors, read by gguf_config.
_SKIPPED = {"rope_freqs.weight"}


@functools.lru_cache(maxsize=4)
def _open(path: str, mtime_ns: int, size: int) -> GgufFile:
    return GgufFile(path)


def open_gguf(path) -> GgufFile:
    """A memory-mapped reader for `path` (returned as is if already a reader)."""
    # Loading asks for config, eos ids and weights separately: parse once. The key
    # includes mtime and size so a rewritten file is read afresh.
    if isinstance(path, GgufFile):
        return path
    p = Path(path).resolve()
    st = p.stat()
    return _open(str(p), st.st_mtime_ns, st.st_size)


def _meta(reader: GgufFile, key: str, default=None):
    return reader.fields.get(key, default)


def _f32(value) -> float:
    # Metadata floats are float32: 1e-5 is stored as 9.99999974e-06. The shortest
    # decimal that round-trips float32 recovers the value the converter was given.
    return float(str(np.float32(value)))


def _arch(reader: GgufFile) -> str:
    arch = _meta(reader, "general.architecture")
    if arch not in _ARCHS:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; supported: {', '.join(_ARCHS)}"
        )
    return arch


def _rope_parameters(reader: GgufFile, arch: str, theta: float, head_dim: int) -> dict:
    rope = {"rope_type": "default", "rope_theta": theta}
    kind = _meta(reader, f"{arch}.rope.scaling.type")
    factor = _meta(reader, f"{arch}.rope.scaling.factor")
    orig = _meta(reader, f"{arch}.rope.scaling.original_context_length")
    if kind == "linear" and factor:
        rope.update(rope_type="linear", factor=_f32(factor))
    elif kind == "yarn" and factor:
        rope.update(rope_type="yarn", factor=_f32(factor))
        if orig:
            rope["original_max_position_embeddings"] = int(orig)
        for gguf_key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if (v := _meta(reader, f"{arch}.rope.scaling.{gguf_key}")) is not None:
                rope[hf_key] = _f32(v)
    elif kind == "llama3" and factor:  # not written by llama.cpp, but some converters do
        rope.update(
            rope_type="llama3",
            factor=_f32(factor),
            low_freq_factor=_f32(_meta(reader, f"{arch}.rope.scaling.low_freq_factor", 1.0)),
            high_freq_factor=_f32(_meta(reader, f"{arch}.rope.scaling.high_freq_factor", 4.0)),
            original_max_position_embeddings=int(orig or 8192),
        )
    elif (t := next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)):
        factors = np.asarray(t.data, np.float64)
        rope.update(_llama3_from_freq_factors(factors, theta, head_dim, orig))
    return rope


def _llama3_from_freq_factors(f: np.ndarray, theta: float, head_dim: int, orig) -> dict:
    """Recover HF llama3 rope parameters from llama.cpp's `rope_freqs` tensor.

    llama.cpp's converter stores llama3 scaling only as per-frequency divisors f_i:
    1 for short wavelengths, `factor` for long ones, and in between
    1/f = (1 - s)/factor + s with s = (C/wavelen - low)/(high - low). s is linear in
    1/wavelen, so a fit gives C/(high-low) and -low/(high-low); any C with those two
    ratios yields the same frequencies. We take C from metadata, else llama3's 8192.
    """
    factor = _f32(f.max())
    if factor <= 1.0 + 1e-6:
        return {}
    if f.min() > 1 + 1e-4:  # every frequency scaled: plain linear scaling
        return {"rope_type": "linear", "factor": factor}
    inv_freq = theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    x = inv_freq[: len(f)] / (2 * math.pi)  # 1 / wavelen
    mid = (f > 1 + 1e-4) & (f < factor - 1e-4)
    ctx = float(orig or 8192)
    if mid.sum() >= 2:
        s = (1 / f[mid] - 1 / factor) / (1 - 1 / factor)
        a, b = np.polyfit(x[mid], s, 1)
        low, high = -b * ctx / a, (1 - b) * ctx / a
    else:
        # No smooth band: put both boundaries between the last 1 and the first `factor`.
        low = ctx * math.sqrt(x[f <= 1 + 1e-4].min() * x[f > 1 + 1e-4].max())
        high = low * (1 + 1e-6)  # HF divides by high - low
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": float(low),
        "high_freq_factor": float(high),
        "original_max_position_embeddings": int(ctx),
    }


def gguf_config(path) -> PretrainedConfig:
    """The `transformers` config a GGUF file's metadata describes."""
    reader = open_gguf(path)
    arch = _arch(reader)
    config_cls, hf_arch = _ARCHS[arch]

    def get(key, default=None):
        return _meta(reader, f"{arch}.{key}", default)

    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    kv_heads = int(get("attention.head_count_kv", heads))
    head_dim = get("attention.key_length")
    if head_dim is None and arch == "llama":
        # llama.cpp writes the full head size as the rope dimension for llama.
        head_dim = get("rope.dimension_count")
    head_dim = int(head_dim or hidden // heads)
    vocab = get("vocab_size")
    if vocab is None:
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = len(tokens) if tokens is not None else None
    if vocab is None:
        embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
        vocab = embd.shape[1]
    theta = _f32(get("rope.freq_base", 10000.0))
    names = {t.name for t in reader.tensors}

    kwargs = dict(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_hidden_layers=int(get("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=_f32(get("attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(get("context_length", 2048)),
        rope_parameters=_rope_parameters(reader, arch, theta, head_dim),
        tie_word_embeddings="output.weight" not in names,
        architectures=[hf_arch],
        bos_token_id=_meta(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_meta(reader, "tokenizer.ggml.eos_token_id"),
        pad_token_id=_meta(reader, "tokenizer.ggml.padding_token_id"),
    )
    if arch == "llama":
        kwargs["attention_bias"] = "blk.0.attn_q.bias" in names
    if arch == "qwen2":
        del kwargs["head_dim"]  # Qwen2Config derives it from hidden / heads
    return config_cls(**kwargs)


def gguf_eos_token_ids(path) -> set[int]:
    """Token ids that end generation: EOS plus end-of-turn / end-of-message if given."""
    reader = open_gguf(path)
    keys = ("eos_token_id", "eot_token_id", "eom_token_id")
    return {int(v) for k in keys if (v := _meta(reader, f"tokenizer.ggml.{k}")) is not None}


def _hf_name(name: str) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _LAYER_RE.fullmatch(name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        raise ValueError(f"unexpected GGUF tensor {name!r}")
    return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (`LlamaModel.permute` in its converter).

    HF rotates each head's first half against its second half; llama.cpp rotates
    adjacent pairs, so its converter interleaves the halves: row h*d + 2j + t of the
    GGUF tensor is HF row h*d + t*d/2 + j. Applies to weights and biases alike.
    """
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _permuted_heads(reader: GgufFile, arch: str, gguf_name: str) -> int | None:
    """llama's q and k rows are permuted in the file (see `_unpermute`): over how many heads."""
    if arch != "llama":
        return None
    heads = int(_meta(reader, f"{arch}.attention.head_count"))
    if ".attn_q." in gguf_name:
        return heads
    if ".attn_k." in gguf_name:
        return int(_meta(reader, f"{arch}.attention.head_count_kv", heads))
    return None


def iter_gguf_weights(path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF parameter name, float32 tensor), one tensor dequantized at a time."""
    reader = open_gguf(path)
    arch = _arch(reader)
    for t in reader.tensors:
        if t.name in _SKIPPED:
            continue
        shape = tuple(reversed(t.shape))
        w = dequantize(t.data, t.tensor_type, shape)
        if heads := _permuted_heads(reader, arch, t.name):
            w = _unpermute(w, heads)
        yield _hf_name(t.name), w


_FLOAT_TYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def gguf_file_weights(path) -> dict[str, FileWeight]:
    """HF parameter name -> how the file stores that matrix (file_weights.py); a
    block type's bytes are read from the memory-mapped file when asked for."""
    reader = open_gguf(path)
    arch = _arch(reader)
    formats = {}
    for t in reader.tensors:
        if t.name in _SKIPPED or len(t.shape) != 2:
            continue
        kind = t.tensor_type.name
        if kind in _FLOAT_TYPES:
            formats[_hf_name(t.name)] = FileWeight(_FLOAT_TYPES[kind])
            continue

        def blocks(data=t.data, heads=_permuted_heads(reader, arch, t.name)) -> torch.Tensor:
            rows = torch.from_numpy(np.array(data, dtype=np.uint8))  # a copy: the map is read-only
            return _unpermute(rows, heads) if heads else rows

        formats[_hf_name(t.name)] = FileWeight(kind, blocks)
    return formats
