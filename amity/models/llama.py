"""The Llama decoder family: Llama 2/3.x, SmolLM2, Mistral, Qwen2/2.5, Qwen3.

One implementation; the differences are config switches: Qwen2 adds a bias to the
q/k/v projections, Qwen3 RMS-normalises q and k per head before rotary, and tied
models reuse the token embedding as the LM head. Parameter names follow the
Hugging Face checkpoints so weights load by name.

The model runs on a flat batch of tokens from many sequences at once; attention
finds each sequence's context through the paged KV cache (see attention.py).
"""

import torch
import torch.nn.functional as F
from torch import nn

from amity.models.attention import AttentionMetadata, paged_attention
from amity.models.rotary import RotaryEmbedding, apply_rotary


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 as transformers does, then cast back.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class MergedLinear(nn.Linear):
    """Several projections of the same input as one matmul: `shard_names` are the
    checkpoint's separate layers (e.g. q/k/v_proj), stacked along the output in that
    order; the loader fills each slice under its checkpoint name (see loader.py)."""

    def __init__(self, in_features: int, output_sizes: list[int], shard_names: list[str], bias: bool):
        super().__init__(in_features, sum(output_sizes), bias=bias)
        self.output_sizes = output_sizes
        self.shard_names = shard_names


class Attention(nn.Module):
    def __init__(self, config, qkv_bias: bool, qk_norm: bool):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        hidden = config.hidden_size
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(hidden, [self.q_size, self.kv_size, self.kv_size],
                                     ["q_proj", "k_proj", "v_proj"], bias=qkv_bias)
        self.o_proj = nn.Linear(self.q_size, hidden, bias=getattr(config, "attention_bias", False))
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.qk_norm = qk_norm
        self.scale = self.head_dim ** -0.5
        self.prompt_rows = None  # set by quantize_model under --prompt-tiles: prompt rows attend on tiles

    def forward(self, x, rope: tuple[torch.Tensor, torch.Tensor], kv_cache, meta: AttentionMetadata):
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, k, *rope)
        tile_rows = self.prompt_rows.mask if self.prompt_rows is not None else None
        out = paged_attention(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, tile_rows)
        return self.o_proj(out.reshape(num_tokens, -1))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = MergedLinear(config.hidden_size, [config.intermediate_size] * 2,
                                         ["gate_proj", "up_proj"], bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config, qkv_bias, qk_norm):
        super().__init__()
        self.self_attn = Attention(config, qkv_bias, qk_norm)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, rope, kv_cache, meta):
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config, qkv_bias: bool, qk_norm: bool):
        super().__init__()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.rotary = RotaryEmbedding(head_dim, config.max_position_embeddings,
                                      getattr(config, "rope_parameters", None))
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, qkv_bias, qk_norm) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, inputs_embeds, positions, kv_cache, meta):
        x = inputs_embeds
        rope = self.rotary(positions, x.dtype)  # once per step, shared by every layer
        for layer, layer_kv in zip(self.layers, kv_cache):
            x = layer(x, rope, layer_kv, meta)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    qkv_bias = False
    qk_norm = False

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, self.qkv_bias or getattr(config, "attention_bias", False),
                                self.qk_norm)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.tie_weights()

    def tie_weights(self) -> None:
        """Tied models hold one parameter under two names: it loads as
        embed_tokens.weight, and the LM head stays an nn.Linear that quantization
        can replace on its own. Moving off the meta device unties them: call again."""
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, inputs_embeds, positions, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] for a flat batch of tokens; `kv_cache`:
        [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim] (attention.py)."""
        return self.model(inputs_embeds, positions, kv_cache, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
